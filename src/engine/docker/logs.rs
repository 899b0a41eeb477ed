//! A container's logs, stdout and stderr.

use super::*;

pub(super) async fn logs(
    engine: &DockerEngine,
    id: &str,
    tail: Option<usize>,
) -> EngineResult<String> {
    let tail = tail.map_or_else(|| "all".to_string(), |n| n.to_string());
    let opts = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .tail(&tail)
        .build();
    let chunks: Vec<_> = match engine.docker.logs(id, Some(opts)).try_collect().await {
        Ok(c) => c,
        Err(e) => return Err(engine.refused(format!("read the logs of {id}"), e).await),
    };
    let mut out = String::new();
    for chunk in chunks {
        out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
    }
    Ok(out)
}
