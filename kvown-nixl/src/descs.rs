//! Descriptor lists of host memory: [`RegList`] (what to register) and [`XferList`] (what one
//! side of a transfer covers), each destroyed on drop.

use crate::error::NixlError;
use crate::ffi::check;
use crate::ffi::{self, Api};

/// A registration descriptor list (`nixl_reg_dlist_t`) of host memory.
pub(crate) struct RegList<'a> {
    api: &'a Api,
    pub(crate) raw: ffi::RegDlist,
}

impl<'a> RegList<'a> {
    /// An empty list.
    pub(crate) fn new(api: &'a Api) -> Result<RegList<'a>, NixlError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` receives a new list.
        check("nixl_capi_create_reg_dlist", unsafe {
            (api.nixl_capi_create_reg_dlist)(ffi::MEM_DRAM, &mut raw)
        })?;
        Ok(RegList { api, raw })
    }

    /// Adds `len` bytes at `addr`.
    pub(crate) fn push(&mut self, addr: usize, len: usize) -> Result<(), NixlError> {
        // SAFETY: valid list; the descriptor only records the range.
        check("nixl_capi_reg_dlist_add_desc", unsafe {
            (self.api.nixl_capi_reg_dlist_add_desc)(self.raw, addr, len, 0, std::ptr::null(), 0)
        })
    }
}

impl Drop for RegList<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            (self.api.nixl_capi_destroy_reg_dlist)(self.raw);
        }
    }
}

/// A transfer descriptor list (`nixl_xfer_dlist_t`) of host memory.
pub(crate) struct XferList<'a> {
    api: &'a Api,
    pub(crate) raw: ffi::XferDlist,
}

impl<'a> XferList<'a> {
    /// An empty list.
    pub(crate) fn new(api: &'a Api) -> Result<XferList<'a>, NixlError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` receives a new list.
        check("nixl_capi_create_xfer_dlist", unsafe {
            (api.nixl_capi_create_xfer_dlist)(ffi::MEM_DRAM, &mut raw)
        })?;
        Ok(XferList { api, raw })
    }

    /// Adds `len` bytes at `addr`.
    pub(crate) fn push(&mut self, addr: u64, len: u64) -> Result<(), NixlError> {
        // SAFETY: valid list; the descriptor only records the range (NIXL checks it against
        // the registrations when the request is made).
        check("nixl_capi_xfer_dlist_add_desc", unsafe {
            (self.api.nixl_capi_xfer_dlist_add_desc)(self.raw, addr as usize, len as usize, 0)
        })
    }
}

impl Drop for XferList<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            (self.api.nixl_capi_destroy_xfer_dlist)(self.raw);
        }
    }
}
