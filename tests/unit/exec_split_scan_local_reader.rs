//! Unit tests of `src/exec/split_scan/local_reader.rs`: byte ranges of a
//! local file, read whole or refused.

use std::io;

use datafusion_grad::exec::split_scan::local_reader::read_ranges;

#[test]
fn ranges_are_read_whole_or_refused() {
    let dir = std::env::temp_dir().join(format!("local_reader_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bytes");
    let content: Vec<u8> = (0..=255).cycle().take(100_000).collect();
    std::fs::write(&path, &content).unwrap();
    let read = read_ranges(&path, &[0..10, 70_000..100_000, 5..5, 99_999..100_000]).unwrap();
    assert_eq!(read[0].as_ref(), &content[0..10]);
    assert_eq!(read[1].as_ref(), &content[70_000..100_000]);
    assert!(read[2].is_empty());
    assert_eq!(read[3].as_ref(), &content[99_999..]);
    let past = read_ranges(&path, &[0..10, 99_000..100_001]).unwrap_err();
    assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = read_ranges(&path, &[0..10, 20..10]).unwrap_err();
    assert_eq!(backwards.kind(), io::ErrorKind::InvalidInput);
    std::fs::remove_dir_all(&dir).unwrap();
}
