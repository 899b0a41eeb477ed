//! Where a proxy's tasks can run: its placement constraints evaluated against the Swarm's nodes,
//! as Swarm's scheduler does (swarmkit's `constraint.Match`: case-insensitive equality, a
//! missing label is the empty string). A global service whose constraints match no node has no
//! task at all, so nothing would ever fail: berth says so before it changes anything, naming
//! the constraint and the command that labels a node.

use std::collections::BTreeMap;

use bollard::models::{Node, NodeSpecAvailabilityEnum, NodeSpecRoleEnum, NodeState};

/// What a constraint can test of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub id: String,
    pub hostname: String,
    /// "manager" or "worker".
    pub role: String,
    pub os: String,
    pub arch: String,
    pub labels: BTreeMap<String, String>,
    pub engine_labels: BTreeMap<String, String>,
    /// Availability active and state ready: Swarm places new tasks there.
    pub schedulable: bool,
    /// "drain", "pause" or "down" when not schedulable.
    pub why_not: Option<String>,
}

impl NodeFacts {
    pub fn of(n: &Node) -> NodeFacts {
        let spec = n.spec.clone().unwrap_or_default();
        let desc = n.description.clone().unwrap_or_default();
        let platform = desc.platform.clone().unwrap_or_default();
        let availability = spec.availability;
        let state = n.status.as_ref().and_then(|s| s.state);
        let why_not = match (availability, state) {
            (Some(a), _) if a != NodeSpecAvailabilityEnum::ACTIVE => Some(a.to_string()),
            (_, Some(s)) if s != NodeState::READY => Some(s.to_string()),
            _ => None,
        };
        NodeFacts {
            id: n.id.clone().unwrap_or_default(),
            hostname: desc.hostname.clone().unwrap_or_default(),
            role: match spec.role {
                Some(NodeSpecRoleEnum::MANAGER) => "manager".into(),
                Some(NodeSpecRoleEnum::WORKER) => "worker".into(),
                _ => String::new(),
            },
            os: platform.os.unwrap_or_default(),
            arch: platform.architecture.unwrap_or_default(),
            labels: spec.labels.unwrap_or_default().into_iter().collect(),
            engine_labels: desc
                .engine
                .and_then(|e| e.labels)
                .unwrap_or_default()
                .into_iter()
                .collect(),
            schedulable: why_not.is_none(),
            why_not,
        }
    }

    /// The value of a constraint's attribute on this node ("" when absent).
    fn attribute(&self, attr: &str) -> String {
        let get = |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
        match attr {
            "node.id" => self.id.clone(),
            "node.hostname" => self.hostname.clone(),
            "node.role" => self.role.clone(),
            "node.platform.os" => self.os.clone(),
            "node.platform.arch" => self.arch.clone(),
            _ => {
                if let Some(k) = attr.strip_prefix("node.labels.") {
                    get(&self.labels, k)
                } else if let Some(k) = attr.strip_prefix("engine.labels.") {
                    get(&self.engine_labels, k)
                } else {
                    String::new()
                }
            }
        }
    }

    /// Whether the node meets one constraint (`attr == value` or `attr != value`, as berth's
    /// config check normalized it).
    pub fn meets(&self, constraint: &str) -> bool {
        let (attr, eq, value) = match (constraint.split_once("=="), constraint.split_once("!=")) {
            (Some((a, v)), None) => (a, true, v),
            (None, Some((a, v))) => (a, false, v),
            _ => return false,
        };
        let have = self.attribute(attr.trim());
        have.eq_ignore_ascii_case(value.trim()) == eq
    }

    pub fn meets_all(&self, constraints: &[String]) -> bool {
        constraints.iter().all(|c| self.meets(c))
    }
}

/// The nodes a proxy with `constraints` can run on now, or why there is none: the sentence
/// names the constraints, what each node lacks, and what to do.
pub fn eligible<'a>(
    proxy: &str,
    constraints: &[String],
    nodes: &'a [NodeFacts],
) -> Result<Vec<&'a NodeFacts>, String> {
    let matching: Vec<&NodeFacts> = nodes.iter().filter(|n| n.meets_all(constraints)).collect();
    let schedulable: Vec<&NodeFacts> = matching.iter().copied().filter(|n| n.schedulable).collect();
    if !schedulable.is_empty() {
        return Ok(schedulable);
    }
    let name = |n: &NodeFacts| {
        if n.hostname.is_empty() {
            n.id.clone()
        } else {
            n.hostname.clone()
        }
    };
    if !matching.is_empty() {
        let which: Vec<String> = matching
            .iter()
            .map(|n| format!("{} ({})", name(n), n.why_not.as_deref().unwrap_or("?")))
            .collect();
        return Err(format!(
            "proxy {proxy}: Swarm cannot place its tasks: the node(s) its constraints ({}) match are not available: {}; make one available (`docker node update --availability active NODE`)",
            constraints.join(", "),
            which.join(", ")
        ));
    }
    let unmet: Vec<String> = constraints
        .iter()
        .filter(|c| !nodes.iter().any(|n| n.meets(c)))
        .cloned()
        .collect();
    let hint = label_hint(&unmet);
    Err(format!(
        "proxy {proxy}: Swarm cannot place its tasks: no node of this Swarm ({}) meets its constraints ({}){}{hint}",
        nodes.iter().map(name).collect::<Vec<_>>().join(", "),
        constraints.join(", "),
        if unmet.is_empty() {
            String::new()
        } else {
            format!("; none meets {}", unmet.join(", "))
        },
    ))
}

/// The command that makes a node meet `node.labels.K == V` constraints, when those are the
/// ones unmet.
fn label_hint(unmet: &[String]) -> String {
    let labels: Vec<String> = unmet
        .iter()
        .filter_map(|c| {
            let (attr, value) = c.split_once("==")?;
            let key = attr.trim().strip_prefix("node.labels.")?;
            Some(format!("--label-add {key}={}", value.trim()))
        })
        .collect();
    if labels.is_empty() {
        return "; change [proxy.swarm] constraints or the nodes".to_string();
    }
    format!(
        ": label a node (`docker node update {} NODE`) or change [proxy.swarm] constraints",
        labels.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            id: format!("id-{host}"),
            hostname: host.into(),
            role: "manager".into(),
            os: "linux".into(),
            arch: "x86_64".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            schedulable: true,
            ..Default::default()
        }
    }

    #[test]
    fn constraints_match_as_swarm_matches_them() {
        let n = node("a", &[("edge", "True")]);
        assert!(n.meets("node.labels.edge == true"), "case-insensitive");
        assert!(!n.meets("node.labels.edge != true"));
        assert!(
            n.meets("node.labels.other != true"),
            "a missing label is empty"
        );
        assert!(!n.meets("node.labels.other == true"));
        assert!(n.meets("node.role == manager"));
        assert!(n.meets("node.hostname != b"));
        assert!(n.meets("node.platform.os == linux"));
    }

    #[test]
    fn no_matching_node_is_said_with_the_constraint_and_the_label_command() {
        let c = vec!["node.labels.edge == true".to_string()];
        let nodes = [node("a", &[])];
        let e = eligible("edge-global", &c, &nodes).unwrap_err();
        assert!(e.contains("node.labels.edge == true"), "{e}");
        assert!(
            e.contains("docker node update --label-add edge=true NODE"),
            "{e}"
        );
        assert!(e.contains("(a)"), "{e}");
        let nodes = [node("a", &[("edge", "true")]), node("b", &[])];
        let ok = eligible("edge-global", &c, &nodes).unwrap();
        assert_eq!(ok.len(), 1);
        assert!(eligible("edge", &[], &nodes).unwrap().len() == 2);
    }

    #[test]
    fn a_drained_matching_node_is_said_so() {
        let c = vec!["node.labels.edge == true".to_string()];
        let mut n = node("a", &[("edge", "true")]);
        n.schedulable = false;
        n.why_not = Some("drain".into());
        let e = eligible("p", &c, &[n]).unwrap_err();
        assert!(
            e.contains("a (drain)") && e.contains("--availability active"),
            "{e}"
        );
    }
}
