//! Names for new containers: [`replica_name`], with a `-1`, `-2`, … suffix while a name is taken.

use super::*;

/// Picks names for new containers that no observed container (berth's or not) has.
pub(super) struct Names {
    pub(super) taken: BTreeSet<String>,
}

impl Names {
    pub(super) fn fresh(&mut self, proxy: &str, slot: u32, hash: &str) -> String {
        let base = replica_name(proxy, slot, hash);
        let mut name = base.clone();
        let mut n = 0u32;
        while self.taken.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        self.taken.insert(name.clone());
        name
    }
}
