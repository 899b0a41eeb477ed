//! Unit tests of the Docker adapter's pure parts: cgroup ids, image references, restart
//! policies, the engine's name from /version, the version hint.

use super::connect::{parse_api_version, product_of};
use super::containers::restart_policy_of;
use super::images::image_version_hint;
use super::*;

#[test]
fn a_process_cgroup_names_its_container() {
    let id = "d692b2b621254704f4db3d246faf7e22ef4b8d44ebcfb165fafc1ac6d3196d4e";
    let cgroupfs = format!("9:name=systemd:/docker/{id}\n4:memory:/docker/{id}\n0::/docker/{id}\n");
    assert_eq!(container_id_in_cgroup(&cgroupfs).as_deref(), Some(id));
    let systemd = format!("0::/system.slice/docker-{id}.scope\n");
    assert_eq!(container_id_in_cgroup(&systemd).as_deref(), Some(id));
    let podman = format!(
        "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{id}.scope/container\n"
    );
    assert_eq!(container_id_in_cgroup(&podman).as_deref(), Some(id));
    assert_eq!(
        container_id_in_cgroup("0::/user.slice/session-3.scope\n"),
        None
    );
    assert_eq!(container_id_in_cgroup("0::/\n"), None);
}

#[test]
fn splits_image_references() {
    assert_eq!(
        split_image("envoyproxy/envoy:v1.36.2"),
        ("envoyproxy/envoy", "v1.36.2")
    );
    assert_eq!(split_image("envoy"), ("envoy", "latest"));
    assert_eq!(
        split_image("localhost:5000/envoy"),
        ("localhost:5000/envoy", "latest")
    );
    assert_eq!(
        split_image("localhost:5000/envoy:1.40.0"),
        ("localhost:5000/envoy", "1.40.0")
    );
    assert_eq!(split_image("envoy@sha256:abc"), ("envoy@sha256:abc", ""));
}

#[test]
fn restart_policies_translate() {
    assert_eq!(
        restart_policy_of(super::super::RESTART_UNLESS_STOPPED),
        RestartPolicyNameEnum::UNLESS_STOPPED
    );
    assert_eq!(
        RestartPolicyNameEnum::UNLESS_STOPPED.to_string(),
        super::super::RESTART_UNLESS_STOPPED
    );
    assert_eq!(restart_policy_of("no"), RestartPolicyNameEnum::NO);
}

#[test]
fn the_engine_is_named_from_its_version_answer() {
    // Debian's docker.io 20.10 and Debian's podman 4.3, as they answer /version.
    let docker: bollard::models::SystemVersion = serde_json::from_str(
        r#"{"Platform":{"Name":""},"Components":[{"Name":"Engine","Version":"20.10.24+dfsg1"},
        {"Name":"containerd","Version":"1.6.20~ds1"}],"Version":"20.10.24+dfsg1","ApiVersion":"1.41"}"#,
    )
    .unwrap();
    assert_eq!(
        product_of(&docker),
        ("Docker Engine 20.10.24+dfsg1".to_string(), Flavor::Docker)
    );
    let podman: bollard::models::SystemVersion = serde_json::from_str(
        r#"{"Platform":{"Name":"linux/amd64/debian-12"},"Components":[{"Name":"Podman Engine",
        "Version":"4.3.1"},{"Name":"Conmon","Version":"conmon version 2.1.6"}],
        "Version":"4.3.1","ApiVersion":"1.41","MinAPIVersion":"1.24"}"#,
    )
    .unwrap();
    assert_eq!(
        product_of(&podman),
        ("Podman Engine 4.3.1".to_string(), Flavor::Podman)
    );
    let ce: bollard::models::SystemVersion = serde_json::from_str(
        r#"{"Platform":{"Name":"Docker Engine - Community"},"Version":"28.2.2"}"#,
    )
    .unwrap();
    assert_eq!(product_of(&ce).0, "Docker Engine - Community 28.2.2");
    let v = parse_api_version("1.41").unwrap();
    assert_eq!((v.major_version, v.minor_version), (1, 41));
    assert!(parse_api_version("4.3.1x").is_none());
}

#[test]
fn version_hint_from_tag() {
    assert_eq!(image_version_hint("envoyproxy/envoy:v1.36.2"), "1.36.2");
    assert_eq!(image_version_hint("berth-test/envoy:1.39.3"), "1.39.3");
    assert_eq!(image_version_hint("berth-test/does-not-exist:1"), "1.40.0");
    assert_eq!(image_version_hint("envoy"), "1.40.0");
}
