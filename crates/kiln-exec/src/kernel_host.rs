//! What the kernel registry ([`crate::kernels::Kernels`]) needs from the
//! sandbox, as a seam: start a kernel, evaluate in it, interrupt it, its
//! workspace, close it. [`SandboxHost`] is the real one (a long-lived jail
//! under a uid slot of its own, `kiln_sandbox::Kernel`); the registry's unit
//! tests use a fake, as the pipeline's use a fake `Jails`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_core::lang::WarmRecipe;
use kiln_core::{Language, Limits};
use kiln_sandbox::{
    BoxFuture, EvalLimits, EvalResult, Kernel, KernelError, KernelLost, KernelStart, OutputSink,
    ParkSpec, Sandbox, Slot, node_kernel_park, python_kernel_park,
};

/// The templates a `py` kernel may fork, in order of preference: the data
/// stack without the rich one's fork and exit cost, then the others.
const PY_KERNEL_TEMPLATES: &[&str] = &["py-data", "py", "py-lean"];

/// A kernel being started.
pub type Starting<'a> = BoxFuture<'a, Result<Box<dyn HostedKernel>, KernelsError>>;

/// Where kernels come from.
pub trait KernelHost: Send + Sync + 'static {
    /// Whether a kernel of `language` could start now (`Unavailable` or
    /// `Language` if not); asked before any cap is taken.
    fn can_start(&self, language: Language) -> Result<(), KernelsError>;

    /// Starts a kernel of `language` under `limits` (those of one
    /// evaluation; the kernel's own clocks run for `max_age` and a minute).
    fn start(&self, language: Language, limits: Limits, max_age: Duration) -> Starting<'_>;

    /// [`KernelHost::start`] for a kernel started ahead of any create (the
    /// kernel pool's refill): it may start and wait at idle CPU priority
    /// until [`HostedKernel::taken`]. A host without priorities starts it
    /// as any other.
    fn start_ahead(&self, language: Language, limits: Limits, max_age: Duration) -> Starting<'_> {
        self.start(language, limits, max_age)
    }

    /// Whether a `py` kernel can be started now.
    fn ready(&self) -> bool;

    /// What a kernel of `language` started now would run from (the `py`
    /// template it forks); kernels started ahead must match it to be
    /// handed out. Errs as [`KernelHost::can_start`] does.
    fn template(&self, language: Language) -> Result<String, KernelsError> {
        self.can_start(language).map(|()| String::new())
    }

    /// Closes what the host holds of its own (kernels started ahead); the
    /// registry calls it last, at shutdown.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// One live kernel, as the registry uses it.
pub trait HostedKernel: Send + Sync + 'static {
    /// Evaluates `code`, showing its output to `sink` as it arrives.
    fn eval<'a>(
        &'a self,
        code: &'a str,
        limits: EvalLimits,
        sink: Option<&'a OutputSink>,
    ) -> BoxFuture<'a, Result<EvalResult, KernelError>>;

    /// Interrupts the evaluation in progress, if any; `false` when the
    /// kernel is gone.
    fn interrupt(&self) -> BoxFuture<'_, bool>;

    /// Why the kernel is gone, once it is.
    fn lost(&self) -> Option<KernelLost>;

    /// Kills the kernel.
    fn close(&self) -> BoxFuture<'_, ()>;

    /// The host path of its `/mnt/data` and the uid and gid files written
    /// there must belong to, while it holds its slot.
    fn workspace(&self) -> Option<(PathBuf, (u32, u32))>;

    /// Gives back its slot, and with it the workspace.
    fn release(&self);

    /// Memory the kernel holds now, bytes.
    fn memory_now(&self) -> Option<u64>;

    /// A create took this kernel started ahead
    /// ([`KernelHost::start_ahead`]): it runs at normal CPU priority from
    /// now on. Nothing for a kernel that never waited at another.
    fn taken(&self) {}
}

/// Kernels as jails of the sandbox.
pub struct SandboxHost {
    sandbox: Sandbox,
}

impl SandboxHost {
    pub fn new(sandbox: Sandbox) -> Arc<SandboxHost> {
        Arc::new(SandboxHost { sandbox })
    }

    /// How a kernel of `language` is parked and started, and the template
    /// it forks (`py`) or `node` (`js`, a pre-started node like a warm `js`
    /// jail's, in the same environment).
    fn program(
        &self,
        language: Language,
        limits: &Limits,
    ) -> Result<(ParkSpec, Vec<String>, &'static str), KernelsError> {
        match &language.spec().warm {
            Some(WarmRecipe::Embedded { interpreter, .. }) => {
                let template = PY_KERNEL_TEMPLATES
                    .iter()
                    .find(|t| self.sandbox.has_zygote(t))
                    .ok_or_else(|| {
                        KernelsError::Unavailable("no Python fork-server is running".to_owned())
                    })?;
                let argv = vec![
                    (*interpreter).to_owned(),
                    "-u".to_owned(),
                    format!("/etc/kiln/{}", kiln_core::lang::warm::PYTHON_KERNEL_NAME),
                ];
                // on the system (runtime image) of its language, as the
                // fork-server it forks from
                let park = ParkSpec {
                    language: Some(language),
                    ..python_kernel_park(template)
                };
                Ok((park, argv, template))
            }
            Some(WarmRecipe::Prestart { .. }) => {
                let node = language.spec().run[0];
                let system = self.sandbox.config().system_of(Some(language));
                if !system.source_of(std::path::Path::new(node)).is_file() {
                    return Err(KernelsError::Unavailable(format!(
                        "{node} is not installed"
                    )));
                }
                let park = ParkSpec {
                    language: Some(language),
                    ..node_kernel_park(node, language.environment(limits))
                };
                let argv = park.argv.clone();
                Ok((park, argv, "node"))
            }
            None => Err(KernelsError::Language(language.name().to_owned())),
        }
    }
}

impl KernelHost for SandboxHost {
    fn can_start(&self, language: Language) -> Result<(), KernelsError> {
        self.program(language, &Limits::default()).map(|_| ())
    }

    fn template(&self, language: Language) -> Result<String, KernelsError> {
        self.program(language, &Limits::default())
            .map(|(_, _, t)| t.to_owned())
    }

    fn start(&self, language: Language, limits: Limits, max_age: Duration) -> Starting<'_> {
        Box::pin(self.start_as(language, limits, max_age, false))
    }

    fn start_ahead(&self, language: Language, limits: Limits, max_age: Duration) -> Starting<'_> {
        Box::pin(self.start_as(language, limits, max_age, true))
    }

    fn ready(&self) -> bool {
        PY_KERNEL_TEMPLATES
            .iter()
            .any(|t| self.sandbox.has_zygote(t))
    }
}

impl SandboxHost {
    /// Starts a kernel of `language`, `ahead` of any create (at idle CPU
    /// priority until taken) or for one.
    async fn start_as(
        &self,
        language: Language,
        limits: Limits,
        max_age: Duration,
        ahead: bool,
    ) -> Result<Box<dyn HostedKernel>, KernelsError> {
        let (park, argv, template) = self.program(language, &limits)?;
        // a kernel slot: its filesystem (made ahead, or now) goes with it
        let t_slot = std::time::Instant::now();
        let slot = self
            .sandbox
            .acquire_kernel_slot()
            .await
            .map_err(|e| KernelsError::Unavailable(e.to_string()))?;
        let slot_time = t_slot.elapsed();
        // the evaluation timeouts are the registry's; the jail's own wall
        // and CPU clocks only bound the kernel's life
        let mut life = limits.clone();
        life.wall_time = max_age + Duration::from_secs(60);
        life.cpu_time = life.wall_time;
        let start = KernelStart {
            park,
            argv,
            env: language.environment(&limits),
            limits: life,
        };
        let started = if ahead {
            self.sandbox.start_kernel_ahead(&slot, start).await
        } else {
            self.sandbox.start_kernel(&slot, start).await
        };
        let kernel = started.map_err(|e| KernelsError::Kernel(e.to_string()))?;
        let (park, ready) = kernel.start_times();
        tracing::info!(
            template,
            slot_ms = slot_time.as_secs_f64() * 1000.0,
            park_ms = park.as_secs_f64() * 1000.0,
            ready_ms = ready.as_secs_f64() * 1000.0,
            "kernel started"
        );
        Ok(Box::new(JailKernel {
            kernel,
            slot: Mutex::new(Some(slot)),
        }) as Box<dyn HostedKernel>)
    }
}

/// A kernel in a jail, and its uid slot (released as soon as the kernel is
/// gone).
struct JailKernel {
    kernel: Kernel,
    slot: Mutex<Option<Slot>>,
}

impl JailKernel {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Slot>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl HostedKernel for JailKernel {
    fn eval<'a>(
        &'a self,
        code: &'a str,
        limits: EvalLimits,
        sink: Option<&'a OutputSink>,
    ) -> BoxFuture<'a, Result<EvalResult, KernelError>> {
        Box::pin(self.kernel.eval(code, limits, sink))
    }

    fn interrupt(&self) -> BoxFuture<'_, bool> {
        Box::pin(self.kernel.interrupt())
    }

    fn lost(&self) -> Option<KernelLost> {
        self.kernel.lost()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.kernel.close())
    }

    fn workspace(&self) -> Option<(PathBuf, (u32, u32))> {
        self.slot().as_ref().map(|s| {
            (
                self.kernel.workspace().to_path_buf(),
                (s.host_uid(), s.host_gid()),
            )
        })
    }

    fn release(&self) {
        self.slot().take();
    }

    fn memory_now(&self) -> Option<u64> {
        self.kernel.memory_now()
    }

    fn taken(&self) {
        self.kernel.run_at_normal_priority();
    }
}

/// Why a call of the kernel registry ([`crate::kernels::Kernels`]) failed
/// (here, beside the seam, which answers with it too).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelsError {
    #[error("unsupported session language {0:?}: sessions run py or js")]
    Language(String),
    #[error("no such session")]
    NotFound,
    #[error("the caller has {0} live sessions, the most allowed")]
    OwnerCap(usize),
    #[error("this node runs {0} live sessions, the most it allows")]
    NodeFull(usize),
    #[error("the session is busy with another evaluation")]
    Busy,
    #[error("session lost: {0}")]
    Lost(KernelLost),
    #[error("sessions are unavailable: {0}")]
    Unavailable(String),
    #[error("kernel failed: {0}")]
    Kernel(String),
    #[error("no such file")]
    FileNotFound,
    #[error("workspace: {0}")]
    Files(String),
}

impl From<KernelError> for KernelsError {
    fn from(e: KernelError) -> Self {
        match e {
            KernelError::Lost(l) => KernelsError::Lost(l),
            other => KernelsError::Kernel(other.to_string()),
        }
    }
}
