//! Per-layer K/V data pools (work in progress).
