//! [`Agent`]: one NIXL agent with its UCX backend, the peers whose metadata it has loaded, and
//! the notifications peers send it.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::NixlError;
use crate::ffi::check;
use crate::ffi::{self, Api};
use crate::library::api;
use crate::metadata::{LoadedPeer, PeerMetadata, PoolDescriptor};

/// How to build an [`Agent`].
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// UCX transports to restrict the backend to (UCX's `TLS`, e.g. `"tcp"`); `None` lets UCX
    /// pick (on one machine: `cma` for the data, `tcp` for notifications).
    pub ucx_transports: Option<String>,
}

/// A NIXL agent (`nixlAgent`) with one UCX backend, created without NIXL's progress thread:
/// transfers progress inside this crate's calls (posting, polling, reading notifications), so
/// nothing writes a registered buffer while no call is running. Calls are serialised by NIXL
/// (`NIXL_THREAD_SYNC_STRICT`), so clones may be used from several threads. The last clone
/// dropped destroys the agent, after every registration and request made through it.
#[derive(Clone)]
pub struct Agent {
    pub(crate) inner: Arc<AgentInner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.inner.name)
            .field("incarnation", &self.inner.incarnation)
            .finish()
    }
}

/// The agent's handles and the state kept beside them.
pub(crate) struct AgentInner {
    pub(crate) api: Arc<Api>,
    pub(crate) raw: ffi::Agent,
    backend: ffi::Backend,
    name: String,
    incarnation: u64,
    /// Loaded peers: agent name -> incarnation.
    peers: Mutex<HashMap<String, u64>>,
    /// The map `nixl_capi_get_notifs` fills, reused (emptied after each read).
    notif_map: Mutex<ffi::NotifMap>,
}

// SAFETY: the handles are only passed to NIXL, which serialises calls on one agent
// (NIXL_THREAD_SYNC_STRICT); the Rust-side state is behind mutexes.
unsafe impl Send for AgentInner {}
// SAFETY: as above.
unsafe impl Sync for AgentInner {}

impl Drop for AgentInner {
    fn drop(&mut self) {
        // SAFETY: the handles were created by this agent and are destroyed once; every
        // registration and request holds an `Arc` of this inner, so none outlives it. Errors
        // cannot be acted on in a destructor.
        unsafe {
            (self.api.nixl_capi_destroy_notif_map)(
                *self
                    .notif_map
                    .get_mut()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            (self.api.nixl_capi_destroy_backend)(self.backend);
            (self.api.nixl_capi_destroy_agent)(self.raw);
        }
    }
}

/// One notification: who sent it and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender's agent name.
    pub agent: String,
    /// The message.
    pub message: Vec<u8>,
}

/// A C string of `name`, or [`NixlError::BadName`].
pub(crate) fn c_name(name: &str) -> Result<CString, NixlError> {
    CString::new(name).map_err(|_| NixlError::BadName {
        name: name.to_string(),
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Agent {
    /// An agent named `name` with a UCX backend of default options.
    pub fn new(name: &str) -> Result<Agent, NixlError> {
        Agent::with_options(name, &AgentOptions::default())
    }

    /// An agent named `name` with a UCX backend built from `options`. Its incarnation (see
    /// [`Agent::incarnation`]) is the creation time.
    pub fn with_options(name: &str, options: &AgentOptions) -> Result<Agent, NixlError> {
        let api = api()?;
        let c_name = c_name(name)?;
        let config = ffi::AgentConfig {
            enable_prog_thread: false,
            enable_listen_thread: false,
            listen_port: 0,
            thread_sync: ffi::THREAD_SYNC_STRICT,
            num_workers: 1,
            pthr_delay_us: 0,
            lthr_delay_us: 0,
            capture_telemetry: false,
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid name and config; `raw` receives the handle.
        check("nixl_capi_create_configured_agent", unsafe {
            (api.nixl_capi_create_configured_agent)(c_name.as_ptr(), &config, &mut raw)
        })?;
        let mut notif_map = std::ptr::null_mut();
        // SAFETY: `notif_map` receives a new map.
        let created = check("nixl_capi_create_notif_map", unsafe {
            (api.nixl_capi_create_notif_map)(&mut notif_map)
        });
        let backend = created.and_then(|()| ucx_backend(&api, raw, options));
        let backend = match backend {
            Ok(backend) => backend,
            Err(error) => {
                // SAFETY: destroying what was created above, once.
                unsafe {
                    if !notif_map.is_null() {
                        (api.nixl_capi_destroy_notif_map)(notif_map);
                    }
                    (api.nixl_capi_destroy_agent)(raw);
                }
                return Err(error);
            }
        };
        let incarnation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        Ok(Agent {
            inner: Arc::new(AgentInner {
                api,
                raw,
                backend,
                name: name.to_string(),
                incarnation,
                peers: Mutex::new(HashMap::new()),
                notif_map: Mutex::new(notif_map),
            }),
        })
    }

    /// The agent's name, which peers address it by.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// When this agent was created (nanoseconds since the Unix epoch): a restarted peer of the
    /// same name has a larger one, which is how a stale copy of its metadata is told apart.
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    /// NIXL's metadata of this agent (`nixl_capi_get_local_md`): its UCX address and the
    /// memory it has registered, as a blob a peer loads. Take it after registering.
    pub(crate) fn local_md(&self) -> Result<Vec<u8>, NixlError> {
        let api = &self.inner.api;
        let (mut data, mut len) = (std::ptr::null_mut::<c_void>(), 0usize);
        // SAFETY: `data` receives a malloc'd buffer of `len` bytes on success.
        check("nixl_capi_get_local_md", unsafe {
            (api.nixl_capi_get_local_md)(self.inner.raw, &mut data, &mut len)
        })?;
        // SAFETY: NIXL malloc'd `len` bytes at `data`; they are copied, then freed once.
        let bytes = unsafe {
            let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec();
            libc::free(data);
            bytes
        };
        Ok(bytes)
    }

    /// This agent's metadata for a peer: NIXL's blob and the description of `pool`.
    pub fn metadata(&self, pool: &PoolDescriptor) -> Result<PeerMetadata, NixlError> {
        Ok(PeerMetadata {
            agent: self.name().to_string(),
            incarnation: self.incarnation(),
            pool: pool.clone(),
            nixl: self.local_md()?,
        })
    }

    /// Loads a peer's metadata (`nixl_capi_load_remote_md`), so transfers can address its
    /// memory. The same incarnation again is a no-op; a newer incarnation of a loaded peer (it
    /// restarted) replaces the old one, which is invalidated first; an older one is refused
    /// ([`NixlError::StaleMetadata`]) and changes nothing.
    pub fn load_peer(&self, metadata: &PeerMetadata) -> Result<LoadedPeer, NixlError> {
        let mut peers = lock(&self.inner.peers);
        let loaded = LoadedPeer {
            agent: metadata.agent.clone(),
            incarnation: metadata.incarnation,
            pool: metadata.pool.clone(),
        };
        match peers.get(&metadata.agent).copied() {
            Some(known) if known == metadata.incarnation => return Ok(loaded),
            Some(known) if known > metadata.incarnation => {
                return Err(NixlError::StaleMetadata {
                    agent: metadata.agent.clone(),
                    loaded: known,
                    offered: metadata.incarnation,
                });
            }
            Some(_) => {
                self.invalidate(&metadata.agent)?;
                peers.remove(&metadata.agent);
            }
            None => {}
        }
        let name = self.load_remote_md(&metadata.nixl)?;
        if name != metadata.agent {
            // Keep NIXL's table in step with ours before refusing.
            let _ = self.invalidate(&name);
            return Err(NixlError::BadMetadata {
                reason: format!(
                    "NIXL's blob names agent {name:?}, the metadata {:?}",
                    metadata.agent
                ),
            });
        }
        peers.insert(name, metadata.incarnation);
        Ok(loaded)
    }

    /// Forgets a peer (`nixl_capi_invalidate_remote_md`): its process is gone. Transfers set up
    /// for it then refuse to post ([`NixlError::PeerRestarted`]). Unknown peers are ignored.
    pub fn forget_peer(&self, agent: &str) -> Result<(), NixlError> {
        let mut peers = lock(&self.inner.peers);
        if peers.contains_key(agent) {
            self.invalidate(agent)?;
            peers.remove(agent);
        }
        Ok(())
    }

    /// The incarnation of `agent` loaded now, if any.
    pub fn peer_incarnation(&self, agent: &str) -> Option<u64> {
        lock(&self.inner.peers).get(agent).copied()
    }

    fn load_remote_md(&self, blob: &[u8]) -> Result<String, NixlError> {
        if blob.is_empty() {
            return Err(NixlError::BadMetadata {
                reason: "NIXL's blob is empty".into(),
            });
        }
        let api = &self.inner.api;
        let mut name: *mut c_char = std::ptr::null_mut();
        // SAFETY: `blob` is readable for its length; `name` receives a strdup'd string.
        let code = unsafe {
            (api.nixl_capi_load_remote_md)(
                self.inner.raw,
                blob.as_ptr().cast(),
                blob.len(),
                &mut name,
            )
        };
        check("nixl_capi_load_remote_md", code).map_err(|error| NixlError::BadMetadata {
            reason: format!("NIXL refused the blob: {error}"),
        })?;
        // SAFETY: on success `name` is a NUL-terminated strdup'd string, freed once here.
        let agent = unsafe {
            let agent = CStr::from_ptr(name).to_string_lossy().into_owned();
            libc::free(name.cast());
            agent
        };
        Ok(agent)
    }

    fn invalidate(&self, agent: &str) -> Result<(), NixlError> {
        let name = c_name(agent)?;
        // SAFETY: valid agent handle and name.
        check("nixl_capi_invalidate_remote_md", unsafe {
            (self.inner.api.nixl_capi_invalidate_remote_md)(self.inner.raw, name.as_ptr())
        })
    }

    /// Sends `message` to the loaded peer `agent` as a notification (`nixl_capi_gen_notif`),
    /// with no transfer.
    pub(crate) fn notify(&self, agent: &CStr, message: &[u8]) -> Result<(), NixlError> {
        let args = OptArgs::new(&self.inner)?;
        // SAFETY: valid agent, name and options; `message` is readable for its length.
        check("nixl_capi_gen_notif", unsafe {
            (self.inner.api.nixl_capi_gen_notif)(
                self.inner.raw,
                agent.as_ptr(),
                message.as_ptr().cast(),
                message.len(),
                args.raw,
            )
        })
    }

    /// Appends the notifications that arrived since the last call (`nixl_capi_get_notifs`),
    /// progressing the agent's transfers as it reads.
    pub fn take_notifications(&self, out: &mut Vec<Notification>) -> Result<(), NixlError> {
        let api = &self.inner.api;
        let map = lock(&self.inner.notif_map);
        let map = *map;
        // SAFETY: `map` is this agent's map, used under its lock; the strings and bytes the map
        // lends are copied before it is cleared.
        unsafe {
            check(
                "nixl_capi_get_notifs",
                (api.nixl_capi_get_notifs)(self.inner.raw, map, std::ptr::null_mut()),
            )?;
            let mut agents = 0usize;
            check(
                "nixl_capi_notif_map_size",
                (api.nixl_capi_notif_map_size)(map, &mut agents),
            )?;
            for index in 0..agents {
                let mut name: *const c_char = std::ptr::null();
                check(
                    "nixl_capi_notif_map_get_agent_at",
                    (api.nixl_capi_notif_map_get_agent_at)(map, index, &mut name),
                )?;
                let mut count = 0usize;
                check(
                    "nixl_capi_notif_map_get_notifs_size",
                    (api.nixl_capi_notif_map_get_notifs_size)(map, name, &mut count),
                )?;
                let agent = CStr::from_ptr(name).to_string_lossy().into_owned();
                for at in 0..count {
                    let (mut data, mut len) = (std::ptr::null::<c_void>(), 0usize);
                    check(
                        "nixl_capi_notif_map_get_notif",
                        (api.nixl_capi_notif_map_get_notif)(map, name, at, &mut data, &mut len),
                    )?;
                    let message = match len {
                        0 => Vec::new(),
                        len => std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec(),
                    };
                    out.push(Notification {
                        agent: agent.clone(),
                        message,
                    });
                }
            }
            check(
                "nixl_capi_notif_map_clear",
                (api.nixl_capi_notif_map_clear)(map),
            )
        }
    }
}

/// Creates the UCX backend of `agent`, with `options`' transports.
fn ucx_backend(
    api: &Api,
    agent: ffi::Agent,
    options: &AgentOptions,
) -> Result<ffi::Backend, NixlError> {
    let plugin = c_name("UCX")?;
    let (mut mems, mut params) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid agent and plugin name; the lists are destroyed below.
    check("nixl_capi_get_plugin_params", unsafe {
        (api.nixl_capi_get_plugin_params)(agent, plugin.as_ptr(), &mut mems, &mut params)
    })?;
    let mut backend = std::ptr::null_mut();
    let created = (|| {
        if let Some(transports) = &options.ucx_transports {
            // UCX settings for this backend only, as `KEY=value` (NIXL's `engine_config`).
            let key = c_name("engine_config")?;
            let value = c_name(&format!("TLS={transports}"))?;
            // SAFETY: valid params and strings.
            check("nixl_capi_params_add", unsafe {
                (api.nixl_capi_params_add)(params, key.as_ptr(), value.as_ptr())
            })?;
        }
        // SAFETY: valid agent, plugin name and params; `backend` receives the handle.
        check("nixl_capi_create_backend", unsafe {
            (api.nixl_capi_create_backend)(agent, plugin.as_ptr(), params, &mut backend)
        })
    })();
    // SAFETY: the lists returned above, destroyed once.
    unsafe {
        (api.nixl_capi_destroy_mem_list)(mems);
        (api.nixl_capi_destroy_params)(params);
    }
    created.map(|()| backend)
}

/// A `nixl_capi_opt_args_t` naming the agent's UCX backend, destroyed on drop.
pub(crate) struct OptArgs<'a> {
    api: &'a Api,
    pub(crate) raw: ffi::OptArgs,
}

impl<'a> OptArgs<'a> {
    /// Options that route a call to `agent`'s UCX backend.
    pub(crate) fn new(agent: &'a AgentInner) -> Result<OptArgs<'a>, NixlError> {
        let api = agent.api.as_ref();
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` receives new options.
        check("nixl_capi_create_opt_args", unsafe {
            (api.nixl_capi_create_opt_args)(&mut raw)
        })?;
        let args = OptArgs { api, raw };
        // SAFETY: valid options and backend.
        check("nixl_capi_opt_args_add_backend", unsafe {
            (api.nixl_capi_opt_args_add_backend)(raw, agent.backend)
        })?;
        Ok(args)
    }

    /// Asks for `message` to be delivered to the peer once the transfer completes.
    pub(crate) fn notify(&mut self, message: &[u8]) -> Result<(), NixlError> {
        // SAFETY: valid options; `message` is readable for its length.
        unsafe {
            check(
                "nixl_capi_opt_args_set_notif_msg",
                (self.api.nixl_capi_opt_args_set_notif_msg)(
                    self.raw,
                    message.as_ptr().cast(),
                    message.len(),
                ),
            )?;
            check(
                "nixl_capi_opt_args_set_has_notif",
                (self.api.nixl_capi_opt_args_set_has_notif)(self.raw, true),
            )
        }
    }

    /// Keeps NIXL from merging adjacent descriptors (to measure descriptors one by one).
    pub(crate) fn skip_merge(&mut self) -> Result<(), NixlError> {
        // SAFETY: valid options.
        check("nixl_capi_opt_args_set_skip_desc_merge", unsafe {
            (self.api.nixl_capi_opt_args_set_skip_desc_merge)(self.raw, true)
        })
    }
}

impl Drop for OptArgs<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            (self.api.nixl_capi_destroy_opt_args)(self.raw);
        }
    }
}
