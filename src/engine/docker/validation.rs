//! One-shot containers run to completion (Envoy's `--mode validate` of a new spec): create, wait
//! for the exit within the job's deadline, collect the output, remove.

use super::*;

pub(super) async fn run_to_completion(
    engine: &DockerEngine,
    job: &OneShot,
) -> EngineResult<Exited> {
    let body = ContainerCreateBody {
        image: Some(job.image.clone()),
        user: Some(job.hardening.user.to_string()),
        cmd: Some(job.args.clone()),
        labels: Some(job.labels.clone().into_iter().collect()),
        host_config: Some(host_config(&job.hardening, Network::None, &job.mounts)),
        ..Default::default()
    };
    let id = match engine.docker.create_container(None, body).await {
        Ok(created) => created.id,
        Err(e) => {
            return Err(engine
                .refused(
                    format!("create a throw-away container from {}", job.image),
                    e,
                )
                .await)
        }
    };
    let result = engine.wait_exit(&id, job).await;
    let removed = engine.remove(&id).await;
    let exited = result?;
    removed?;
    Ok(exited)
}

impl DockerEngine {
    pub(super) async fn wait_exit(&self, id: &str, job: &OneShot) -> EngineResult<Exited> {
        self.start(id).await.map_err(|e| match e {
            EngineError::Refused {
                engine,
                status,
                message,
                ..
            } => EngineError::Refused {
                engine,
                operation: format!("start a throw-away container from {} ({id})", job.image),
                status,
                message,
            },
            other => other,
        })?;
        let waited = tokio::time::timeout(job.timeout, async {
            let mut wait = self.docker.wait_container(id, None);
            match wait.next().await {
                Some(Ok(r)) => Ok(r.status_code),
                Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
                Some(Err(e)) => Err(self.refused(format!("wait for container {id}"), e).await),
                None => Err(EngineError::Refused {
                    engine: self.describe(),
                    operation: format!("wait for container {id}"),
                    status: 0,
                    message: "the engine ended the wait without an exit code".into(),
                }),
            }
        })
        .await;
        let code = match waited {
            Ok(r) => r?,
            Err(_) => {
                return Err(EngineError::Timeout {
                    what: format!("container {id} ({})", job.image),
                    timeout: job.timeout,
                })
            }
        };
        let output = self.logs(id, None).await.unwrap_or_default();
        Ok(Exited { code, output })
    }
}
