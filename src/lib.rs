//! kvown facade (work in progress).
