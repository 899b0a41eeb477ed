//! Envoy's bootstrap schema: the descriptors of `envoy.config.bootstrap.v3.Bootstrap` and every
//! message it reaches, compiled at build time from the data-plane-api protos (see `build.rs`).
//! [`super::overrides`] walks them to merge a bootstrap the way protobuf does and to compare
//! parts of two bootstraps as messages rather than as text.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, MessageDescriptor};

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(
        &include_bytes!(concat!(env!("OUT_DIR"), "/envoy_bootstrap_descriptors.bin"))[..],
    )
    .expect("the bootstrap descriptors compiled by build.rs decode")
});

/// The descriptor of a message reachable from the bootstrap, by full name.
pub fn message(full_name: &str) -> MessageDescriptor {
    POOL.get_message_by_name(full_name)
        .unwrap_or_else(|| panic!("{full_name} is in the bootstrap descriptors"))
}

/// `envoy.config.bootstrap.v3.Bootstrap`.
pub fn bootstrap() -> MessageDescriptor {
    message("envoy.config.bootstrap.v3.Bootstrap")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bootstrap_schema_is_there() {
        let b = super::bootstrap();
        let clusters = b
            .get_field_by_name("static_resources")
            .and_then(|f| f.kind().as_message().cloned())
            .and_then(|m| m.get_field_by_name("clusters"))
            .unwrap();
        assert!(clusters.is_list());
        assert!(super::message("envoy.config.core.v3.Address")
            .get_field_by_name("pipe")
            .unwrap()
            .containing_oneof()
            .is_some());
    }
}
