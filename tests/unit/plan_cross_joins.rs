//! Unit tests of `src/plan/cross_joins.rs`: joins merged only where they
//! agree on NULL keys.

use datafusion::prelude::SessionContext;

/// The joins the rule would merge under one NULL equality give the
/// rows SQL gives: a NULL `=` key matches nothing.
#[tokio::test]
async fn a_null_key_of_an_equality_matches_nothing() {
    let ctx = SessionContext::new();
    datafusion_grad::register(&ctx);
    for sql in [
        "CREATE TABLE x(a BIGINT, b BIGINT) AS VALUES (0, 0), (0, NULL)",
        "CREATE TABLE w(a BIGINT, b BIGINT) AS VALUES (0, 0), (NULL, 0)",
        "CREATE TABLE s(k BIGINT) AS VALUES (0)",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    let rows = ctx
        .sql(
            "SELECT count(*) FROM s JOIN (x JOIN w ON x.b = w.a) \
             ON (s.k IS NOT DISTINCT FROM x.a)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let count = datafusion::arrow::util::pretty::pretty_format_batches(&rows)
        .unwrap()
        .to_string();
    assert!(count.contains("| 1 "), "{count}");
}
