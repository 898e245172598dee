//! The compile registry: compile units (a source, or one part of a large one), when each
//! compiles ([`Class`], from what the model runs: [`KernelNeeds`]), its compile on a thread
//! of its own through the disk cache, and the loaded modules of one backend. It knows
//! units; a kernel's own facts (its unit, entry point, storage types) are the kernel
//! table's ([`Kernel::info`]).

mod compile;
mod heads;
mod needs;
mod texts;
mod units;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

pub use compile::compile_options;
use compile::{CompileJob, Compiled, compile_err};
pub use heads::AttnHead;
pub(crate) use needs::Class;
pub use needs::KernelNeeds;
pub use texts::{sources, units};
pub use units::{Part, Source, Unit};

use super::kernels::Kernel;
use super::runtime::{DeviceInfo, Runtime};
use crate::backend::tuning::GpuTuning;
use crate::backend::{BackendError, DType};

/// The loaded kernels of one backend. Every compile unit a first request may run compiles
/// (or is read from the cache) on a thread of its own from [`Kernels::load`] on, while the
/// model's weights upload; what only larger steps run starts once those are ready, the rest
/// when one of its kernels is first asked for ([`Class`]). A unit's module is loaded when
/// one of its kernels is first asked for ([`Kernels::get`]) or when [`Kernels::wait_core`]
/// asks for every core unit. Modules stay loaded as long as this lives.
pub struct Kernels<R: Runtime> {
    slots: HashMap<Unit, Slot<R>>,
    dt: DType,
    /// How every unit compiles (the units not started at load compile from it on first use).
    job: Arc<CompileJob>,
    /// Every [`Class::Later`] unit is loaded ([`Kernels::poll_later`] has nothing to do).
    later_done: std::sync::atomic::AtomicBool,
    started: Instant,
}

impl<R: Runtime> Drop for Kernels<R> {
    /// Joins the compile threads no one waited for (a backend dropped before its lane was
    /// ready, a test that ran a few kernels): a thread still inside NVRTC when the process
    /// exits can crash it there (`free(): invalid pointer` after a passing test run).
    fn drop(&mut self) {
        for slot in self.slots.values() {
            let pending = slot
                .pending
                .lock()
                .map(|mut p| std::mem::replace(&mut *p, Pending::Taken));
            if let Ok(Pending::Running(handle)) = pending {
                let _ = handle.join();
            }
        }
    }
}

/// One unit: when it compiles, its compile thread until joined (none before it starts:
/// [`Pending`]), then its module and functions (or the error, kept as text and returned for
/// every later kernel of the unit).
struct Slot<R: Runtime> {
    class: Class,
    pending: Mutex<Pending>,
    loaded: OnceLock<Result<Loaded<R>, String>>,
}

/// A unit's compile thread.
enum Pending {
    /// Not started (a [`Class::Later`] unit before the core units are ready, a
    /// [`Class::Lazy`] one before its first use).
    NotStarted,
    Running(JoinHandle<Result<Compiled, BackendError>>),
    /// Joined (or being joined) by the unit's first use.
    Taken,
}

struct Loaded<R: Runtime> {
    funcs: HashMap<Kernel, R::Func>,
    _module: R::Module,
}

impl<R: Runtime> Kernels<R> {
    /// Starts compiling (or reading from `cache_dir`) every compile unit with kernels for
    /// `dt` that `needs` says a first request may run ([`Class::Core`]), one thread each, for
    /// the device `info` describes (the others later or on first use; no context is needed
    /// until a module loads), with `tuning`'s compiler threads, priority and kernel folder.
    /// Nothing waits here: a compile error or a missing entry point is returned by the
    /// first [`Kernels::get`] of a kernel in that unit, and by [`Kernels::wait_core`], which
    /// start-up calls before the lane reports ready.
    pub fn load(
        info: &DeviceInfo,
        dt: DType,
        cache_dir: Option<&Path>,
        needs: KernelNeeds,
        tuning: &GpuTuning,
    ) -> Result<Kernels<R>, BackendError> {
        let job = Arc::new(CompileJob::new::<R>(info, dt, cache_dir, tuning));
        // A unit with no entry point for `dt` (qmma.cu in f32) is not compiled. The largest
        // units start first, so they are not queued behind small ones.
        let mut used: Vec<Unit> = Kernel::all()
            .into_iter()
            .filter(|k| k.available(dt))
            .map(Kernel::unit)
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        let dir = job.kernel_dir.as_deref();
        used.sort_by_cached_key(|&u| (std::cmp::Reverse(u.src.full_text(dir).len()), u.name()));
        let mut slots = HashMap::new();
        for unit in used {
            // What a first request may run compiles now, each unit on a thread of its own
            // at the lowest CPU priority (the weight upload on the lane's thread goes first;
            // NVRTC's own threads inherit it); the rest once those are ready, or when first
            // asked for ([`Class`]).
            let class = needs.class(unit, dt);
            let pending = match class {
                Class::Core => Pending::Running(job.clone().spawn::<R>(unit, true)?),
                Class::Later | Class::Lazy => Pending::NotStarted,
            };
            slots.insert(
                unit,
                Slot {
                    class,
                    pending: Mutex::new(pending),
                    loaded: OnceLock::new(),
                },
            );
        }
        Ok(Kernels {
            slots,
            dt,
            job,
            later_done: std::sync::atomic::AtomicBool::new(false),
            started: Instant::now(),
        })
    }

    /// The units of `class`, by name.
    fn units_of(&self, class: Class) -> Vec<Unit> {
        let mut v: Vec<Unit> = self
            .slots
            .iter()
            .filter(|(_, s)| s.class == class)
            .map(|(&u, _)| u)
            .collect();
        v.sort_by_key(|u| u.name());
        v
    }

    /// Waits for every unit a first request may run ([`Class::Core`]) and loads its module,
    /// then starts the [`Class::Later`] compiles in the background: after this, start-up
    /// has seen every compile error that a first request could meet. Logs what the wait
    /// cost.
    pub fn wait_core(&self, rt: &R) -> Result<(), BackendError> {
        let t0 = Instant::now();
        let core = self.units_of(Class::Core);
        for &unit in &core {
            self.slot(rt, unit)?;
        }
        tracing::info!(
            backend = R::NAME,
            sources = core.len(),
            since_start_s = self.started.elapsed().as_secs_f64(),
            waited_s = t0.elapsed().as_secs_f64(),
            "kernels ready"
        );
        // Largest first, as at load.
        let mut later = self.units_of(Class::Later);
        let dir = self.job.kernel_dir.as_deref();
        later.sort_by_cached_key(|&u| std::cmp::Reverse(u.src.full_text(dir).len()));
        for unit in later {
            let slot = &self.slots[&unit];
            let mut pending = slot
                .pending
                .lock()
                .map_err(|_| compile_err::<R>("compile slot poisoned".into()))?;
            if matches!(*pending, Pending::NotStarted) && slot.loaded.get().is_none() {
                *pending = Pending::Running(self.job.clone().spawn::<R>(unit, false)?);
            }
        }
        Ok(())
    }

    /// Whether `unit` is a [`Class::Later`] unit whose module is not loaded yet (its compile
    /// may still run): a step that can do without it takes another path rather than wait
    /// (matmul.rs: batches dequantize for the BLAS while the tiled matmuls compile).
    pub(super) fn pending(&self, unit: Unit) -> bool {
        // Once every Later unit is loaded (soon after start-up), without a lookup: decode
        // steps ask for each matmul and attention launch.
        !self.later_done.load(std::sync::atomic::Ordering::Relaxed)
            && self
                .slots
                .get(&unit)
                .is_some_and(|s| s.class == Class::Later && s.loaded.get().is_none())
    }

    /// Loads every [`Class::Later`] unit whose compile has ended; true if one was loaded
    /// (its error, if it failed, is returned by its first [`Kernels::get`]). Called between
    /// steps, so no module loads while a graph records.
    pub(super) fn poll_later(&self, rt: &R) -> bool {
        if self.later_done.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let (mut loaded, mut left) = (false, false);
        for (&unit, slot) in &self.slots {
            if slot.class != Class::Later || slot.loaded.get().is_some() {
                continue;
            }
            let done = slot
                .pending
                .lock()
                .is_ok_and(|p| matches!(&*p, Pending::Running(h) if h.is_finished()));
            if done {
                let _ = self.slot(rt, unit);
                loaded = true;
            } else {
                left = true;
            }
        }
        if !left {
            self.later_done
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        loaded
    }

    /// [`Kernels::wait_core`], then waits for the [`Class::Later`] units too: every kernel
    /// the model may run is loaded after this (a tensor-parallel rank loads no module once
    /// its communicator exists: loading one while a peer's collective waits on the same
    /// GPUs can deadlock).
    pub fn wait_model(&self, rt: &R) -> Result<(), BackendError> {
        self.wait_core(rt)?;
        let t0 = Instant::now();
        let later = self.units_of(Class::Later);
        for &unit in &later {
            self.slot(rt, unit)?;
        }
        tracing::info!(
            backend = R::NAME,
            sources = later.len(),
            since_start_s = self.started.elapsed().as_secs_f64(),
            waited_s = t0.elapsed().as_secs_f64(),
            "kernels for larger steps ready"
        );
        Ok(())
    }

    /// The loaded module of `unit` (joining its compile thread and loading it on first use).
    fn slot(&self, rt: &R, unit: Unit) -> Result<&Loaded<R>, BackendError> {
        let slot = self.slots.get(&unit).ok_or(BackendError::Unsupported {
            backend: R::NAME,
            op: "kernel source",
            dtype: format!("{:?} ({} has no entry points)", self.dt, unit.name()),
        })?;
        slot.loaded
            .get_or_init(|| Self::finish(rt, unit, self.dt, slot, &self.job, self.started))
            .as_ref()
            .map_err(|message| compile_err::<R>(message.clone()))
    }

    /// Joins `unit`'s compile, loads the module and resolves every entry point of `dt`.
    fn finish(
        rt: &R,
        unit: Unit,
        dt: DType,
        slot: &Slot<R>,
        job: &Arc<CompileJob>,
        started: Instant,
    ) -> Result<Loaded<R>, String> {
        let t0 = Instant::now();
        let pending = std::mem::replace(
            &mut *slot
                .pending
                .lock()
                .map_err(|_| "compile slot poisoned".to_string())?,
            Pending::Taken,
        );
        let handle = match pending {
            Pending::Running(h) => h,
            Pending::NotStarted | Pending::Taken => job
                .clone()
                .spawn::<R>(unit, slot.class == Class::Core)
                .map_err(|e| e.to_string())?,
        };
        let compiled = handle
            .join()
            .unwrap_or_else(|_| Err(compile_err::<R>("compile thread panicked".into())))
            .map_err(|e| e.to_string())?;
        let waited = t0.elapsed().as_secs_f64();
        let module = rt
            .load_module(&compiled.image)
            .map_err(|e| format!("load_module {}: {e}", unit.name()))?;
        let mut funcs = HashMap::new();
        for k in Kernel::all()
            .into_iter()
            .filter(|k| k.unit() == unit && k.available(dt))
        {
            let f = rt.function(&module, &k.entry(dt)).ok_or_else(|| {
                format!(
                    "op {}: {dt:?} entry point {} missing in {}",
                    k.op(),
                    k.entry(dt),
                    unit.name()
                )
            })?;
            funcs.insert(k, f);
        }
        let load_s = t0.elapsed().as_secs_f64() - waited;
        let since_start_s = started.elapsed().as_secs_f64();
        let source = unit.name();
        if slot.class == Class::Core {
            tracing::debug!(
                backend = R::NAME,
                source,
                waited_s = waited,
                load_s,
                since_start_s,
                "kernel source loaded"
            );
        } else {
            // After start-up: a step waited `waited_s` for it (a compile still running, or
            // never started), or it was loaded between steps once compiled.
            tracing::info!(backend = R::NAME, source, class = ?slot.class, waited_s = waited, load_s, since_start_s, "kernel source loaded after start-up");
        }
        Ok(Loaded {
            funcs,
            _module: module,
        })
    }

    /// Compiler resource use of every kernel (each source loaded first; one that fails to
    /// compile is left out): (kernel, registers per thread, local (spill) bytes per thread,
    /// static shared bytes per block).
    pub fn resources(&self, rt: &R) -> Vec<(Kernel, i32, i32, i32)> {
        let mut v: Vec<_> = self
            .slots
            .keys()
            .filter_map(|&unit| self.slot(rt, unit).ok())
            .flat_map(|l| l.funcs.iter())
            .map(|(k, f)| {
                let (regs, local, shared) = rt.resources(f);
                (*k, regs, local, shared)
            })
            .collect();
        v.sort_by_key(|r| format!("{:?}", r.0));
        v
    }

    /// The function of `k`, its source's module loaded on first use.
    pub fn get(&self, rt: &R, k: Kernel) -> Result<&R::Func, BackendError> {
        let unsupported = || BackendError::Unsupported {
            backend: R::NAME,
            op: k.op(),
            dtype: format!("{:?}", self.dt),
        };
        if !k.available(self.dt) {
            return Err(unsupported());
        }
        self.slot(rt, k.unit())?
            .funcs
            .get(&k)
            .ok_or_else(unsupported)
    }
}
