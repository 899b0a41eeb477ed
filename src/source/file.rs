//! berth.toml → IR. TODO
