//! Generates the Envoy Gateway remote-infrastructure gRPC code from
//! `proto/remoteinfra/service.proto`. The .proto is compiled by `protox` (pure Rust), so
//! building berth needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/remoteinfra/service.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true) // tests and `berth` tooling dial the service too
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
