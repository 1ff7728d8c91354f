//! Unit tests of `src/ballista/kept.rs`: the store of kept partitions.

#![cfg(feature = "ballista")]

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryPool, MemoryReservation,
};
use datafusion_grad::ballista::kept::Store;

fn batch(n: i64) -> RecordBatch {
    RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![n; 100])) as _)]).unwrap()
}

fn reservation(pool: &Arc<dyn MemoryPool>, bytes: usize) -> MemoryReservation {
    let r = MemoryConsumer::new("test").register(pool);
    r.try_grow(bytes).unwrap();
    r
}

#[test]
fn other_runs_make_room_and_the_same_run_does_not() {
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(10_000));
    let mut store = Store::default();
    store.keep(
        ("a".into(), 1, 0),
        vec![batch(1)],
        reservation(&pool, 400),
        1000,
    );
    store.keep(
        ("b".into(), 1, 0),
        vec![batch(2)],
        reservation(&pool, 400),
        1000,
    );
    // run b's second partition: run a's entry makes room
    store.keep(
        ("b".into(), 1, 1),
        vec![batch(3)],
        reservation(&pool, 400),
        1000,
    );
    assert!(store.replay(&("a".into(), 1, 0)).is_none());
    assert_eq!(store.replay(&("b".into(), 1, 1)).unwrap()[0], batch(3));
    assert_eq!(store.bytes, 800);
    // no room left within run b: not kept, nothing of b dropped
    store.keep(
        ("b".into(), 1, 2),
        vec![batch(4)],
        reservation(&pool, 400),
        1000,
    );
    assert!(store.replay(&("b".into(), 1, 2)).is_none());
    assert_eq!(store.entries.len(), 2);
    assert_eq!(store.bytes, 800);
    // the pool holds exactly the kept bytes, and gets them back
    assert_eq!(pool.reserved(), 800);
    drop(store);
    assert_eq!(pool.reserved(), 0);
}
