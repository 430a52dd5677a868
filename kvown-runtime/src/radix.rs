//! Radix prefix cache (work in progress).
