//! What Envoy Gateway sends over its remote infrastructure API, for the gRPC tests.
#![allow(dead_code)]

use berth::edges::eg_provider::pb;

/// A listener port as EG names it: lower("<protocol>-<port>").
pub fn port(protocol: &str, n: u16) -> pb::ListenerPort {
    pb::ListenerPort {
        name: format!("{}-{n}", protocol.to_lowercase()),
        protocol: protocol.into(),
        service_port: n.into(),
        container_port: n.into(),
    }
}

/// EG's ProxyInfra for Gateway "default/eg" with an HTTP listener on `http` and a TCP (or
/// `tcp_protocol`) listener on `tcp`; `config` is the EnvoyProxy JSON.
pub fn gateway_proxy(config: &str, http: u16, tcp: u16, tcp_protocol: &str) -> pb::ProxyInfra {
    pb::ProxyInfra {
        metadata: Some(pb::InfraMetadata {
            labels: [
                ("gateway.envoyproxy.io/owning-gateway-name", "eg"),
                ("gateway.envoyproxy.io/owning-gateway-namespace", "default"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            annotations: Default::default(),
            owner_reference: Some(pb::ResourceMetadata {
                kind: "GatewayClass".into(),
                name: "eg".into(),
                ..Default::default()
            }),
        }),
        name: "default/eg".into(),
        namespace: "envoy-gateway-system".into(),
        config: config.as_bytes().to_vec(),
        listeners: vec![
            pb::ProxyListener {
                name: "default/eg/http".into(),
                ports: vec![port("HTTP", http)],
                http3: None,
            },
            pb::ProxyListener {
                name: "default/eg/tcp".into(),
                ports: vec![port(tcp_protocol, tcp)],
                http3: None,
            },
        ],
        addresses: vec![],
        resolved_metric_sinks: vec![],
    }
}

/// A client of berth serve's remote provider on its unix socket, as Envoy Gateway connects.
pub async fn unix_client(
    path: std::path::PathBuf,
) -> pb::envoy_gateway_remote_infrastructure_provider_client::EnvoyGatewayRemoteInfrastructureProviderClient<
    tonic::transport::Channel,
>{
    let channel = tonic::transport::Endpoint::from_static("http://berth.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let io = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(io))
            }
        }))
        .await
        .unwrap();
    pb::envoy_gateway_remote_infrastructure_provider_client::EnvoyGatewayRemoteInfrastructureProviderClient::new(channel)
}
