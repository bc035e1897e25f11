//! The agent → aggregator protocol's data: one [`NodeBatch`] per node per tick, carrying
//! *cumulative* counters with their timestamps (rates are derived by the server, from two
//! points, as metrics-server does). This crate has no I/O and no codec yet: transport,
//! framing and versioned encoding arrive with the stream (a later milestone).
