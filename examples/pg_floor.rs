//! The floor `fence` is compared with (benches/compare.sh): the smallest tokio-postgres
//! program that connects and runs one trivial statement, touching none of fence's objects, so
//! that "× the floor" is what fence adds (its process, its statement) to what any client of
//! the server pays (a process, a connection, a backend, one round trip).
//!
//! Usage: pg_floor URL           → connect, `SELECT 1`
//!        pg_floor URL txn SQL   → connect, BEGIN, SQL, COMMIT pipelined (an unfenced write)

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (url, txn) = match &args[..] {
        [_, url] => (url, None),
        [_, url, op, sql] if op == "txn" => (url, Some(sql)),
        _ => return Err("usage: pg_floor URL [txn SQL]".into()),
    };
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    match txn {
        None => {
            client.query_typed("SELECT 1", &[]).await?;
        }
        Some(sql) => {
            let (begin, body, commit) = tokio::join!(
                client.simple_query("BEGIN"),
                client.simple_query(sql),
                client.simple_query("COMMIT")
            );
            begin?;
            body?;
            commit?;
        }
    }
    Ok(())
}
