//! Our own declarations of the part of NIXL's C API (`libnixl_capi.so`) that K/V transfer needs,
//! and the table of its functions loaded at run time. The C side is NIXL's
//! `src/bindings/rust/wrapper.h`; every symbol named here is checked against the library when it
//! loads ([`Api::load`]), so a library without one is [`Unavailable`], never a crash.

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::Library;

use crate::error::{NixlError, NixlStatus, Unavailable};

/// `nixl_capi_status_t`: 0 is success, 1 "in progress", negative values are errors.
pub(crate) type Status = c_int;
/// `NIXL_CAPI_SUCCESS`.
pub(crate) const SUCCESS: Status = 0;
/// `NIXL_CAPI_IN_PROG`.
pub(crate) const IN_PROG: Status = 1;

/// `Ok(())` for [`SUCCESS`], else the typed failure of `call`.
pub(crate) fn check(call: &'static str, code: i32) -> Result<(), NixlError> {
    match code {
        SUCCESS => Ok(()),
        code => Err(NixlError::Call {
            call,
            status: NixlStatus::from_code(code),
        }),
    }
}

/// `nixl_capi_mem_type_t`'s `NIXL_CAPI_MEM_DRAM`: host memory.
pub(crate) const MEM_DRAM: c_int = 0;

/// `nixl_capi_xfer_op_t`.
pub(crate) const XFER_OP_READ: c_int = 0;

/// `nixl_capi_thread_sync_t`'s `NIXL_CAPI_THREAD_SYNC_STRICT`: the agent takes one lock around
/// every call, so an agent may be shared between threads.
pub(crate) const THREAD_SYNC_STRICT: c_int = 1;

/// `nixl_capi_agent_config_t`, field for field.
#[repr(C)]
pub(crate) struct AgentConfig {
    pub enable_prog_thread: bool,
    pub enable_listen_thread: bool,
    pub listen_port: c_int,
    pub thread_sync: c_int,
    pub num_workers: c_uint,
    pub pthr_delay_us: u64,
    pub lthr_delay_us: u64,
    pub capture_telemetry: bool,
}

/// Declares the opaque handle types (`nixl_capi_*_t`, each a pointer to an incomplete struct).
macro_rules! handles {
    ($($name:ident),* $(,)?) => {
        $(
            #[repr(C)]
            pub(crate) struct $name {
                _opaque: [u8; 0],
            }
        )*
    };
}

handles!(
    AgentS, ParamsS, MemListS, BackendS, OptArgsS, RegDlistS, XferDlistS, XferReqS, NotifMapS,
);

pub(crate) type Agent = *mut AgentS;
pub(crate) type Params = *mut ParamsS;
pub(crate) type MemList = *mut MemListS;
pub(crate) type Backend = *mut BackendS;
pub(crate) type OptArgs = *mut OptArgsS;
pub(crate) type RegDlist = *mut RegDlistS;
pub(crate) type XferDlist = *mut XferDlistS;
pub(crate) type XferReq = *mut XferReqS;
pub(crate) type NotifMap = *mut NotifMapS;

/// Declares [`Api`]: one function pointer per C function, named as in C, and its loader.
macro_rules! api {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*) => {
        /// The C functions, resolved from a loaded `libnixl_capi.so` (kept loaded as long as the
        /// table lives).
        #[allow(non_snake_case)]
        pub(crate) struct Api {
            $(pub(crate) $name: unsafe extern "C" fn($($ty),*) -> $ret,)*
            _library: Library,
        }

        impl Api {
            /// Resolves every declared symbol in `library`, or names the first one missing.
            ///
            /// # Safety
            /// `library` must be NIXL's C API, whose functions have the signatures declared here.
            pub(crate) unsafe fn load(library: Library, path: &str) -> Result<Api, Unavailable> {
                $(
                    // SAFETY: the caller vouches that the library is NIXL's C API, and the type
                    // is the C declaration's.
                    let $name = unsafe {
                        *library
                            .get::<unsafe extern "C" fn($($ty),*) -> $ret>(stringify!($name))
                            .map_err(|error| Unavailable::MissingSymbol {
                                path: path.to_string(),
                                symbol: stringify!($name),
                                detail: error.to_string(),
                            })?
                    };
                )*
                Ok(Api { $($name,)* _library: library })
            }
        }
    };
}

api! {
    fn nixl_capi_is_stub() -> bool;
    fn nixl_capi_create_configured_agent(
        name: *const c_char,
        config: *const AgentConfig,
        agent: *mut Agent,
    ) -> Status;
    fn nixl_capi_destroy_agent(agent: Agent) -> Status;
    fn nixl_capi_get_plugin_params(
        agent: Agent,
        plugin: *const c_char,
        mems: *mut MemList,
        params: *mut Params,
    ) -> Status;
    fn nixl_capi_destroy_mem_list(mems: MemList) -> Status;
    fn nixl_capi_params_add(params: Params, key: *const c_char, value: *const c_char) -> Status;
    fn nixl_capi_destroy_params(params: Params) -> Status;
    fn nixl_capi_create_backend(
        agent: Agent,
        plugin: *const c_char,
        params: Params,
        backend: *mut Backend,
    ) -> Status;
    fn nixl_capi_destroy_backend(backend: Backend) -> Status;
    fn nixl_capi_create_opt_args(args: *mut OptArgs) -> Status;
    fn nixl_capi_destroy_opt_args(args: OptArgs) -> Status;
    fn nixl_capi_opt_args_add_backend(args: OptArgs, backend: Backend) -> Status;
    fn nixl_capi_opt_args_set_notif_msg(args: OptArgs, data: *const c_void, len: usize) -> Status;
    fn nixl_capi_opt_args_set_has_notif(args: OptArgs, has_notif: bool) -> Status;
    fn nixl_capi_opt_args_set_skip_desc_merge(args: OptArgs, skip: bool) -> Status;
    fn nixl_capi_create_reg_dlist(mem_type: c_int, dlist: *mut RegDlist) -> Status;
    fn nixl_capi_destroy_reg_dlist(dlist: RegDlist) -> Status;
    fn nixl_capi_reg_dlist_add_desc(
        dlist: RegDlist,
        addr: usize,
        len: usize,
        dev_id: u64,
        metadata: *const c_void,
        metadata_len: usize,
    ) -> Status;
    fn nixl_capi_register_mem(agent: Agent, dlist: RegDlist, args: OptArgs) -> Status;
    fn nixl_capi_deregister_mem(agent: Agent, dlist: RegDlist, args: OptArgs) -> Status;
    fn nixl_capi_get_local_md(agent: Agent, data: *mut *mut c_void, len: *mut usize) -> Status;
    fn nixl_capi_load_remote_md(
        agent: Agent,
        data: *const c_void,
        len: usize,
        name: *mut *mut c_char,
    ) -> Status;
    fn nixl_capi_invalidate_remote_md(agent: Agent, name: *const c_char) -> Status;
    fn nixl_capi_create_xfer_dlist(mem_type: c_int, dlist: *mut XferDlist) -> Status;
    fn nixl_capi_destroy_xfer_dlist(dlist: XferDlist) -> Status;
    fn nixl_capi_xfer_dlist_add_desc(dlist: XferDlist, addr: usize, len: usize, dev_id: u64)
        -> Status;
    fn nixl_capi_create_xfer_req(
        agent: Agent,
        operation: c_int,
        local: XferDlist,
        remote: XferDlist,
        remote_agent: *const c_char,
        request: *mut XferReq,
        args: OptArgs,
    ) -> Status;
    fn nixl_capi_post_xfer_req(agent: Agent, request: XferReq, args: OptArgs) -> Status;
    fn nixl_capi_get_xfer_status(agent: Agent, request: XferReq) -> Status;
    fn nixl_capi_release_xfer_req(agent: Agent, request: XferReq) -> Status;
    fn nixl_capi_destroy_xfer_req(request: XferReq) -> Status;
    fn nixl_capi_gen_notif(
        agent: Agent,
        remote_agent: *const c_char,
        data: *const c_void,
        len: usize,
        args: OptArgs,
    ) -> Status;
    fn nixl_capi_create_notif_map(map: *mut NotifMap) -> Status;
    fn nixl_capi_destroy_notif_map(map: NotifMap) -> Status;
    fn nixl_capi_get_notifs(agent: Agent, map: NotifMap, args: OptArgs) -> Status;
    fn nixl_capi_notif_map_size(map: NotifMap, size: *mut usize) -> Status;
    fn nixl_capi_notif_map_get_agent_at(
        map: NotifMap,
        index: usize,
        name: *mut *const c_char,
    ) -> Status;
    fn nixl_capi_notif_map_get_notifs_size(
        map: NotifMap,
        name: *const c_char,
        size: *mut usize,
    ) -> Status;
    fn nixl_capi_notif_map_get_notif(
        map: NotifMap,
        name: *const c_char,
        index: usize,
        data: *mut *const c_void,
        len: *mut usize,
    ) -> Status;
    fn nixl_capi_notif_map_clear(map: NotifMap) -> Status;
}
