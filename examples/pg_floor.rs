//! The performance floor `fence` is compared with (README, benches/compare.sh): the smallest
//! tokio-postgres program that connects and runs the same coordinator statement once.
//!
//! Usage: pg_floor URL acquire RESOURCE OWNER   → prints the token
//!        pg_floor URL release RESOURCE OWNER TOKEN
//!        pg_floor URL txn SQL                   → BEGIN, SQL, COMMIT pipelined (unfenced)

use tokio_postgres::types::Type;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, url, op, sql] = &args[..] {
        if op == "txn" {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let (begin, body, commit) = tokio::join!(
                client.simple_query("BEGIN"),
                client.simple_query(sql),
                client.simple_query("COMMIT")
            );
            begin?;
            body?;
            commit?;
            return Ok(());
        }
    }
    let [_, url, op, resource, owner, rest @ ..] = &args[..] else {
        return Err("usage: pg_floor URL acquire|release RESOURCE OWNER [TOKEN]".into());
    };
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let rows = match (op.as_str(), rest) {
        ("acquire", []) => {
            let ttl: i64 = 30_000;
            client
                .query_typed(
                    "SELECT token FROM fence.acquire($1, $2, $3)",
                    &[
                        (resource, Type::TEXT),
                        (owner, Type::TEXT),
                        (&ttl, Type::INT8),
                    ],
                )
                .await?
        }
        ("release", [token]) => {
            let token: i64 = token.parse()?;
            client
                .query_typed(
                    "SELECT token FROM fence.release($1, $2, $3)",
                    &[
                        (resource, Type::TEXT),
                        (owner, Type::TEXT),
                        (&token, Type::INT8),
                    ],
                )
                .await?
        }
        _ => return Err("usage: pg_floor URL acquire|release RESOURCE OWNER [TOKEN]".into()),
    };
    let token: Option<i64> = rows[0].get(0);
    println!("{}", token.unwrap_or_default());
    Ok(())
}
