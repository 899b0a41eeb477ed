//! Pull policy "always" under serve: which image ID each tag names. serve pulls every such
//! image at startup and at each resync (`[serve] resync`, 30 s by default), and a proxy's
//! image that no check has seen yet before its pass. The IDs are kept in
//! [`Shared::image_pins`]; [`Shared::publish`] pins the specs to them, so a tag that moved is a
//! new generation, rolled out like any other change. A pull that fails is logged and counted;
//! the last ID stays pinned (the replicas keep running what they run).

use std::collections::BTreeMap;

use super::{log, Shared};
use crate::core::ir::PullPolicy;
use crate::core::plan::short_image_id;
use crate::core::progress::Reporter;
use crate::core::target::Target;

/// Which images a check pulls.
pub enum Which<'a> {
    /// Every image of a proxy whose pull policy is "always".
    All,
    /// The named proxy's, when no check has pinned it yet.
    Unpinned(&'a str),
}

/// Pins every target whose pull policy is "always" to the ID its image had at the last check.
pub fn pin<'a>(pins: &BTreeMap<String, String>, targets: impl Iterator<Item = &'a mut Target>) {
    for t in targets {
        if t.proxy.config.pull == PullPolicy::Always {
            if let Some(id) = pins.get(&t.desired.spec.image) {
                t.desired.pin_image(id);
            }
        }
    }
}

/// Pulls the images `which` names and republishes the desired state when a tag moved.
pub async fn check(shared: &Shared, which: Which<'_>) {
    let images: Vec<String> = {
        let desired = shared.desired.lock().unwrap_or_else(|e| e.into_inner());
        let pins = shared.image_pins.lock().unwrap_or_else(|e| e.into_inner());
        let mut images: Vec<String> = desired
            .targets
            .iter()
            .filter(|(_, t)| t.proxy.config.pull == PullPolicy::Always)
            .filter(|(name, t)| match which {
                Which::All => true,
                Which::Unpinned(only) => {
                    name.as_str() == only && !pins.contains_key(&t.desired.spec.image)
                }
            })
            .map(|(_, t)| t.desired.spec.image.clone())
            .collect();
        images.sort();
        images.dedup();
        images
    };
    let mut moved = false;
    for image in images {
        let quiet = Reporter::quiet();
        let result = match shared.ops.infra.resolve_image(&image, true, &quiet).await {
            Ok(id) => Ok(id),
            Err(e) => {
                log(shared.opts.mode, &format!("image {image}: {e}"));
                let pinned = shared
                    .image_pins
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains_key(&image);
                // Never checked: pin what is here, so the replicas are not rolled for a
                // registry that is away.
                if pinned {
                    Err(())
                } else {
                    shared
                        .ops
                        .infra
                        .resolve_image(&image, false, &quiet)
                        .await
                        .map_err(|_| ())
                }
            }
        };
        let outcome = match result {
            Err(()) => "failed",
            Ok(None) => "unchanged",
            Ok(Some(id)) => {
                let old = shared
                    .image_pins
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(image.clone(), id.clone());
                match old {
                    Some(old) if old != id => {
                        log(
                            shared.opts.mode,
                            &format!(
                                "image {image}: {} -> {} (the tag names another image now); rolling it out",
                                short_image_id(&old),
                                short_image_id(&id)
                            ),
                        );
                        moved = true;
                        "moved"
                    }
                    Some(_) => "unchanged",
                    None => {
                        moved = true;
                        "pinned"
                    }
                }
            }
        };
        shared.metrics.inc(
            "berth_image_checks_total",
            "Pulls of images whose pull policy is \"always\", by image and outcome (pinned, unchanged, moved, failed).",
            &[("image", &image), ("outcome", outcome)],
        );
    }
    if moved {
        shared.publish(None);
    }
}
