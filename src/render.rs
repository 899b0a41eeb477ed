//! Turns one proxy's IR into files: the Envoy bootstrap and, in standalone mode, the listener
//! and cluster resources Envoy watches. TODO
