//! [`XferRequest`]: one NIXL transfer request, released on drop (which cancels it if it is
//! still in flight).

use std::ffi::CStr;
use std::sync::Arc;

use crate::agent::{AgentInner, OptArgs};
use crate::descs::XferList;
use crate::error::{NixlError, NixlStatus};
use crate::ffi;
use crate::ffi::check;

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Every byte has moved (and the notification, if any, is sent).
    Done,
    /// Still moving.
    InProgress,
}

/// A transfer request (`nixlXferReqH`) of one agent.
pub(crate) struct XferRequest {
    agent: Arc<AgentInner>,
    raw: ffi::XferReq,
}

// SAFETY: the handle is only passed to its agent's calls, which NIXL serialises.
unsafe impl Send for XferRequest {}

/// What one request asks for besides its descriptors.
pub(crate) struct RequestOptions<'a> {
    /// The message the peer is notified with on completion, if any.
    pub notify: Option<&'a [u8]>,
    /// Whether NIXL must post the descriptors as given, without merging neighbours.
    pub skip_merge: bool,
}

impl XferRequest {
    /// A READ of `remote` (the peer's memory) into `local` (this agent's), not yet posted.
    pub(crate) fn read(
        agent: &Arc<AgentInner>,
        local: &XferList<'_>,
        remote: &XferList<'_>,
        peer: &CStr,
        options: &RequestOptions<'_>,
    ) -> Result<XferRequest, NixlError> {
        let mut args = OptArgs::new(agent)?;
        if let Some(message) = options.notify {
            args.notify(message)?;
        }
        if options.skip_merge {
            args.skip_merge()?;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid agent, lists, name and options; `raw` receives the request.
        check("nixl_capi_create_xfer_req", unsafe {
            (agent.api.nixl_capi_create_xfer_req)(
                agent.raw,
                ffi::XFER_OP_READ,
                local.raw,
                remote.raw,
                peer.as_ptr(),
                &mut raw,
                args.raw,
            )
        })?;
        Ok(XferRequest {
            agent: agent.clone(),
            raw,
        })
    }

    /// Posts the request (`nixl_capi_post_xfer_req`).
    pub(crate) fn post(&self) -> Result<Progress, NixlError> {
        // SAFETY: valid agent and request.
        let code = unsafe {
            (self.agent.api.nixl_capi_post_xfer_req)(self.agent.raw, self.raw, std::ptr::null_mut())
        };
        progress("nixl_capi_post_xfer_req", code)
    }

    /// Progresses the agent and reads the request's status (`nixl_capi_get_xfer_status`).
    pub(crate) fn status(&self) -> Result<Progress, NixlStatus> {
        // SAFETY: valid agent and request.
        let code = unsafe { (self.agent.api.nixl_capi_get_xfer_status)(self.agent.raw, self.raw) };
        match code {
            ffi::SUCCESS => Ok(Progress::Done),
            ffi::IN_PROG => Ok(Progress::InProgress),
            code => Err(NixlStatus::from_code(code)),
        }
    }
}

fn progress(call: &'static str, code: i32) -> Result<Progress, NixlError> {
    match code {
        ffi::IN_PROG => Ok(Progress::InProgress),
        code => check(call, code).map(|()| Progress::Done),
    }
}

impl Drop for XferRequest {
    fn drop(&mut self) {
        let api = &self.agent.api;
        // SAFETY: valid agent and request, released then destroyed once. Releasing a request
        // still in flight cancels its UCX operations. If NIXL cannot release it (its backend
        // refuses), the handle still names live state, so it is left alone rather than freed.
        unsafe {
            if (api.nixl_capi_release_xfer_req)(self.agent.raw, self.raw) == ffi::SUCCESS {
                (api.nixl_capi_destroy_xfer_req)(self.raw);
            }
        }
    }
}
