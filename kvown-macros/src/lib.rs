//! Procedural macros of kvown.
