//! Request slots and the request-to-token table (work in progress).
