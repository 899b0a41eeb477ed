//! EG's bootstrap `Merge`: a protobuf merge of the user's bootstrap into the rendered one,
//! exactly as Envoy Gateway does it (`internal/utils/proto.Merge`, Go's `proto.Merge` with one
//! exception), walked over the JSON form of both documents with Envoy's bootstrap schema
//! ([`crate::core::render::descriptors`]):
//!
//! - a field the user sets to its default (`0`, `false`, `""`, the first enum value) is not
//!   set at all and changes nothing, unless the field has presence (`optional`, a oneof member);
//! - a message merges field by field; a list appends the user's items; a map's entries replace
//!   the entries of the same key; setting a member of a oneof clears its other members;
//! - `google.protobuf.Duration` replaces as a whole (EG's exception); an `Any` (a
//!   `typed_config`) replaces as a whole, since its payload is bytes, unless the user gives
//!   only its `@type`; wrappers (`UInt32Value`…) keep the base value when the user's is the
//!   default; `Struct` entries replace, `ListValue` appends;
//! - a field the schema does not know is dropped, as EG's protojson reader drops it.
//!
//! The result is the merged document; the caller checks that it keeps what berth needs.

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value};

use super::kind_of;

/// Merges `overlay` into `base`, both a JSON form of the message `msg`. Returns one note per
/// field of the overlay the schema does not know (dropped, as EG drops it), e.g.
/// "static_resources.clusters[0].frob".
pub fn merge_message(
    base: &mut Map<String, Value>,
    overlay: &Map<String, Value>,
    msg: &MessageDescriptor,
    path: &str,
) -> Result<Vec<String>, String> {
    let mut dropped = Vec::new();
    for (key, value) in overlay {
        let at = join(path, key);
        if value.is_null() {
            // protojson reads null as "not set".
            continue;
        }
        let Some(field) = msg
            .get_field_by_name(key)
            .or_else(|| msg.get_field_by_json_name(key))
        else {
            dropped.push(at);
            continue;
        };
        if let Some(oneof) = field.containing_oneof().filter(|o| !o.is_synthetic()) {
            for other in oneof.fields().filter(|f| f.number() != field.number()) {
                base.remove(other.name());
                base.remove(other.json_name());
            }
        }
        let existing = [field.name(), field.json_name()]
            .into_iter()
            .find(|k| base.contains_key(*k))
            .map(str::to_string);
        let slot_key = existing.unwrap_or_else(|| key.clone());
        if field.is_map() {
            let Value::Object(entries) = value else {
                return Err(format!("{at}: expected a mapping, got {}", kind_of(value)));
            };
            let map = object_slot(base, &slot_key);
            for (k, v) in entries {
                map.insert(k.clone(), fresh(v, &field, &join(&at, k), &mut dropped)?);
            }
        } else if field.is_list() {
            let Value::Array(items) = value else {
                return Err(format!("{at}: expected a list, got {}", kind_of(value)));
            };
            let mut appended = Vec::with_capacity(items.len());
            for (i, v) in items.iter().enumerate() {
                appended.push(fresh(v, &field, &format!("{at}[{i}]"), &mut dropped)?);
            }
            let slot = base
                .entry(slot_key)
                .or_insert_with(|| Value::Array(Vec::new()));
            if !slot.is_array() {
                *slot = Value::Array(Vec::new());
            }
            if let Value::Array(list) = slot {
                list.extend(appended);
            }
        } else if let Kind::Message(m) = field.kind() {
            match base.get_mut(&slot_key) {
                Some(existing) => merge_value(existing, value, &m, &at, &mut dropped)?,
                None => {
                    let v = fresh(value, &field, &at, &mut dropped)?;
                    base.insert(slot_key, v);
                }
            }
        } else if field.supports_presence() || !is_default_scalar(value, &field) {
            base.remove(field.name());
            base.remove(field.json_name());
            base.insert(slot_key, value.clone());
        }
    }
    Ok(dropped)
}

/// What a message-typed (or scalar) value becomes when merged into nothing: unknown fields
/// dropped, as EG's reader drops them.
fn fresh(
    value: &Value,
    field: &FieldDescriptor,
    at: &str,
    dropped: &mut Vec<String>,
) -> Result<Value, String> {
    let kind = if field.is_map() {
        field
            .kind()
            .as_message()
            .and_then(|entry| entry.map_entry_value_field().kind().as_message().cloned())
    } else {
        field.kind().as_message().cloned()
    };
    match kind {
        Some(m) if !is_well_known(&m) => {
            let Value::Object(o) = value else {
                return Err(format!("{at}: expected a mapping, got {}", kind_of(value)));
            };
            let mut out = Map::new();
            dropped.extend(merge_message(&mut out, o, &m, at)?);
            Ok(Value::Object(out))
        }
        _ => Ok(value.clone()),
    }
}

fn is_well_known(m: &MessageDescriptor) -> bool {
    m.full_name().starts_with("google.protobuf.")
}

/// Merges a message-typed value into an existing one.
fn merge_value(
    base: &mut Value,
    overlay: &Value,
    m: &MessageDescriptor,
    at: &str,
    dropped: &mut Vec<String>,
) -> Result<(), String> {
    match m.full_name() {
        // EG replaces durations whole (its one exception to proto.Merge); timestamps and field
        // masks do not occur in a bootstrap in a way worth merging field by field.
        "google.protobuf.Duration" | "google.protobuf.Timestamp" | "google.protobuf.FieldMask" => {
            *base = overlay.clone();
        }
        "google.protobuf.Any" => match (base.as_object_mut(), overlay.as_object()) {
            // Only the type URL given: the payload bytes (the other fields) stay.
            (Some(b), Some(o)) if o.keys().all(|k| k == "@type") => {
                if let Some(t) = o.get("@type") {
                    b.insert("@type".into(), t.clone());
                }
            }
            _ => *base = overlay.clone(),
        },
        "google.protobuf.Struct" => match (base.as_object_mut(), overlay.as_object()) {
            (Some(b), Some(o)) => {
                for (k, v) in o {
                    b.insert(k.clone(), v.clone());
                }
            }
            _ => *base = overlay.clone(),
        },
        "google.protobuf.ListValue" => match (base.as_array_mut(), overlay.as_array()) {
            (Some(b), Some(o)) => b.extend(o.iter().cloned()),
            _ => *base = overlay.clone(),
        },
        "google.protobuf.Value" => match (base, overlay) {
            (Value::Object(b), Value::Object(o)) => {
                for (k, v) in o {
                    b.insert(k.clone(), v.clone());
                }
            }
            (Value::Array(b), Value::Array(o)) => b.extend(o.iter().cloned()),
            (b, o) => *b = o.clone(),
        },
        name if name.starts_with("google.protobuf.") && name.ends_with("Value") => {
            // Wrappers: the JSON form is the wrapped scalar; its `value` is set only when it is
            // not the default.
            let value = m.get_field_by_name("value");
            let default = value.is_some_and(|f| is_default_scalar(overlay, &f));
            if !default {
                *base = overlay.clone();
            }
        }
        _ => match (base.as_object_mut(), overlay.as_object()) {
            (Some(b), Some(o)) => dropped.extend(merge_message(b, o, m, at)?),
            (_, Some(o)) => {
                let mut out = Map::new();
                dropped.extend(merge_message(&mut out, o, m, at)?);
                *base = Value::Object(out);
            }
            (_, None) => {
                return Err(format!(
                    "{at}: expected a mapping, got {}",
                    kind_of(overlay)
                ));
            }
        },
    }
    Ok(())
}

/// Whether a JSON scalar is the proto3 default of `field` (and so is "not set").
fn is_default_scalar(v: &Value, field: &FieldDescriptor) -> bool {
    match v {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => match field.kind() {
            Kind::Enum(e) => {
                s.is_empty() || e.get_value(0).is_some_and(|zero| zero.name() == s.as_str())
            }
            Kind::Int64
            | Kind::Sint64
            | Kind::Sfixed64
            | Kind::Uint64
            | Kind::Fixed64
            | Kind::Int32
            | Kind::Sint32
            | Kind::Sfixed32
            | Kind::Uint32
            | Kind::Fixed32
            | Kind::Double
            | Kind::Float => s.trim().parse::<f64>().is_ok_and(|f| f == 0.0),
            _ => s.is_empty(),
        },
        _ => false,
    }
}

fn object_slot<'a>(base: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = base
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::render::descriptors;
    use serde_json::json;

    fn merged(base: Value, overlay: Value) -> (Value, Vec<String>) {
        let mut b = base.as_object().unwrap().clone();
        let dropped = merge_message(
            &mut b,
            overlay.as_object().unwrap(),
            &descriptors::bootstrap(),
            "",
        )
        .unwrap();
        (Value::Object(b), dropped)
    }

    #[test]
    fn lists_append_so_an_added_cluster_keeps_xds_cluster() {
        let (v, _) = merged(
            json!({"static_resources": {"clusters": [{"name": "xds_cluster", "type": "STRICT_DNS"}]}}),
            json!({"static_resources": {"clusters": [{"name": "otel", "type": "STATIC"}]}}),
        );
        let names: Vec<_> = v["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["xds_cluster", "otel"]);
    }

    #[test]
    fn a_oneof_member_replaces_the_others() {
        // admin.address is an Address: socket_address and pipe are one oneof. Envoy rejected
        // the old list-replacing merge's result: "'pipe' has already been set".
        let (v, _) = merged(
            json!({"admin": {"address": {"pipe": {"path": "/run/berth/admin.sock", "mode": 384}}}}),
            json!({"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 19000}}}}),
        );
        assert_eq!(
            v["admin"]["address"],
            json!({"socket_address": {"address": "127.0.0.1", "port_value": 19000}})
        );
    }

    #[test]
    fn messages_merge_and_defaults_change_nothing() {
        let (v, _) = merged(
            json!({"stats_config": {"use_all_default_tags": true}, "overload_manager": {"refresh_interval": "0.25s"}}),
            json!({"stats_config": {"use_all_default_tags": false, "stats_tags": [{"tag_name": "a", "regex": "x"}]},
                   "overload_manager": {"refresh_interval": "1s"}}),
        );
        // false is proto3's default: "not set", so the base's true stays.
        assert_eq!(v["stats_config"]["use_all_default_tags"], true);
        assert_eq!(v["stats_config"]["stats_tags"][0]["tag_name"], "a");
        // Durations replace whole.
        assert_eq!(v["overload_manager"]["refresh_interval"], "1s");
    }

    #[test]
    fn map_entries_replace_and_any_replaces_whole() {
        let base = json!({"static_resources": {"clusters": [{"name": "c",
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions":
                {"@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                 "explicit_http_config": {"http2_protocol_options": {}}}}}]},
            "node": {"metadata": {"a": 1, "b": {"c": 2}}}});
        let (v, _) = merged(
            base,
            json!({"node": {"metadata": {"b": {"d": 3}}, "cluster": "x"}}),
        );
        // Struct entries replace: b is the overlay's, a stays.
        assert_eq!(v["node"]["metadata"], json!({"a": 1, "b": {"d": 3}}));
        assert_eq!(v["node"]["cluster"], "x");
        let mut b = json!({"@type": "t", "x": 1});
        merge_value(
            &mut b,
            &json!({"@type": "t", "y": 2}),
            &descriptors::message("google.protobuf.Any"),
            "",
            &mut vec![],
        )
        .unwrap();
        assert_eq!(b, json!({"@type": "t", "y": 2}));
    }

    #[test]
    fn camel_case_keys_find_their_snake_case_fields() {
        let (v, _) = merged(
            json!({"stats_flush_interval": "5s"}),
            json!({"statsFlushInterval": "10s"}),
        );
        assert_eq!(v, json!({"stats_flush_interval": "10s"}));
    }

    #[test]
    fn unknown_fields_are_dropped_as_eg_drops_them() {
        let (v, dropped) = merged(
            json!({"node": {"cluster": "a"}}),
            json!({"node": {"frob": 1}, "nonsense": true, "static_resources": {"clusters": [{"name": "c", "bogus": 2}]}}),
        );
        assert_eq!(
            dropped,
            [
                "node.frob",
                "nonsense",
                "static_resources.clusters[0].bogus"
            ]
        );
        assert_eq!(v["node"], json!({"cluster": "a"}));
        assert_eq!(v["static_resources"]["clusters"][0], json!({"name": "c"}));
    }

    #[test]
    fn wrong_shapes_are_errors() {
        let mut b = Map::new();
        let e = merge_message(
            &mut b,
            json!({"static_resources": {"clusters": {"name": "x"}}})
                .as_object()
                .unwrap(),
            &descriptors::bootstrap(),
            "",
        )
        .unwrap_err();
        assert!(
            e.contains("static_resources.clusters: expected a list"),
            "{e}"
        );
    }
}
