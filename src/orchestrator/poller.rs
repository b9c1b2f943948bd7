//! The poller thread: reloads the workflow file, fetches candidates and refreshes the issues the
//! state thread names, reads steering sources after each poll, and fetches an issue whose
//! retry is due. It owns the current load (settings and tracker) and shares it with the state
//! thread; everything it learns goes back as an [`Event`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::panic_text;
use super::protocol::{Event, IssueId, Key, PollReport};
use crate::config::{self, SecretResolver, Settings};
use crate::env::Env;
use crate::tracker::{self, Tracker};

/// Settings the command line forces over the workflow's.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub port: Option<u16>,
    /// The workflow's name in a daemon serving several: a workspace root its file does not
    /// set (the default, or `SVC_WORKSPACE_ROOT`'s) gets a folder of that name under it, so
    /// two workflows' issues of one identifier never share a workspace.
    pub workflow: Option<String>,
}

impl Overrides {
    pub fn apply(&self, mut settings: Settings, env: &Env) -> Settings {
        if let Some(port) = self.port {
            settings.server.port = port;
        }
        if let Some(name) = &self.workflow {
            let ws = &mut settings.workspace;
            let from_env = env.non_empty("SVC_WORKSPACE_ROOT");
            if ws.root_setting.is_none() || ws.root_setting.as_deref() == from_env {
                ws.root = ws.root.join(name);
                ws.root_setting = ws.root_setting.take().map(|r| format!("{r}/{name}"));
            }
        }
        settings
    }
}

/// Work for the poller thread.
pub enum PollJob {
    Poll {
        ids: Vec<IssueId>,
        include_terminal: bool,
        /// The issues steering is read for: running, retrying or waiting for a slot.
        steer: std::collections::BTreeSet<IssueId>,
        /// The trackers' messages that wait for their issue's next run (a parked issue's
        /// feedback sends it back with `rework_state`).
        waiting: Vec<crate::steering::Message>,
    },
    Fetch(Key),
    /// The steering sources' cursors the claim store held (sent once, before the first poll).
    SteeringCursors(std::collections::BTreeMap<String, String>),
}

/// The workflow file as last loaded, and the tracker built from it. Shared by the poller (which
/// reloads it) and the state thread (which hands the tracker to runs).
pub struct Loaded {
    pub settings: Arc<Settings>,
    pub tracker: Arc<dyn Tracker>,
    text: String,
}

/// The current tracker of a shared load (an `Arc` clone under a briefly held lock).
/// The workflows a daemon serves, by name, each with its current load: what the HTTP server
/// serves `/mcp` and webhooks for, kept current by the state thread.
pub type Served = Arc<std::sync::RwLock<Vec<(Arc<str>, Arc<Mutex<Loaded>>)>>>;

pub fn current_tracker(loaded: &Mutex<Loaded>) -> Arc<dyn Tracker> {
    Arc::clone(&loaded.lock().unwrap_or_else(|p| p.into_inner()).tracker)
}

pub struct Poller {
    path: PathBuf,
    env: Arc<Env>,
    overrides: Overrides,
    /// The daemon-wide keys of every workflow, which a reload must agree with (empty with one
    /// workflow).
    shared: config::workflows::DaemonWide,
    secrets: SecretResolver,
    current: Arc<Mutex<Loaded>>,
    /// The daemon's durable store for the trackers it builds (filled once the store opens).
    facts: crate::facts::Later,
    /// The last error reading the file, so a missing or unreadable file is reported once, not
    /// at every poll.
    read_error: Option<String>,
    /// Each steering source's cursor (the state thread stores them with what they yielded).
    steering_cursors: std::collections::BTreeMap<String, String>,
    /// The last steering failure reported, so a lasting one is logged once.
    steering_error: Option<String>,
    /// The job under way has sent its answer (`PollDone`, `RetryFetched`): a panic after it
    /// (while reading steering, say) must not answer twice.
    answered: bool,
}

impl Poller {
    /// Loads the workflow for the first time; errors are fatal at start.
    pub fn start(
        path: PathBuf,
        env: Arc<Env>,
        overrides: Overrides,
        shared: config::workflows::DaemonWide,
    ) -> Result<(Poller, Vec<config::Warning>), String> {
        let mut secrets = SecretResolver::new(crate::process::run_program);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let loaded = config::workflows::load_shared(&path, &env, &mut secrets, &shared)
            .map_err(|e| e.to_string())?;
        crate::process::withhold(&loaded.settings.credential_vars);
        let settings = Arc::new(overrides.apply(loaded.settings, &env));
        let facts = crate::facts::Later::default();
        let tracker: Arc<dyn Tracker> = Arc::from(
            tracker::build_keeping(&settings.tracker, &env, &facts).map_err(|e| e.to_string())?,
        );
        let current = Arc::new(Mutex::new(Loaded {
            settings,
            tracker,
            text,
        }));
        Ok((
            Poller {
                path,
                env,
                overrides,
                shared,
                secrets,
                current,
                facts,
                read_error: None,
                steering_cursors: Default::default(),
                steering_error: None,
                answered: false,
            },
            loaded.warnings,
        ))
    }

    pub fn current(&self) -> Arc<Mutex<Loaded>> {
        Arc::clone(&self.current)
    }

    /// Hands the daemon's durable store to the trackers built so far and from now on.
    pub fn keep_facts(&self, facts: Arc<dyn crate::facts::Facts>) {
        self.facts.fill(facts);
    }

    /// Writes the port actually bound back into the settings (for `server.port: 0`), now and
    /// for every reload.
    pub fn set_port(&mut self, port: u16) {
        self.overrides.port = Some(port);
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let mut settings = (*current.settings).clone();
        settings.server.port = port;
        current.settings = Arc::new(settings);
    }

    /// Re-reads the workflow; a changed, valid file replaces the settings and tracker.
    fn reload(&mut self, events: &Sender<Event>) {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => {
                self.read_error = None;
                t
            }
            Err(e) => {
                let message = format!("{}: cannot read workflow file: {e}", self.path.display());
                if self.read_error.as_ref() != Some(&message) {
                    log::warn!("workflow reload failed, keeping the last good settings: {message}");
                    let _ = events.send(Event::ReloadFailed(message.clone()));
                    self.read_error = Some(message);
                }
                return;
            }
        };
        if text == self.current.lock().unwrap_or_else(|p| p.into_inner()).text {
            return;
        }
        let result = config::workflow::parse(&self.path, &text)
            .map_err(|e| e.to_string())
            .and_then(|mut file| {
                if let Err(e) = self.shared.check_and_fill(&mut file) {
                    return Err(config::LoadError::Invalid {
                        path: file.path.clone(),
                        errors: vec![e],
                        warnings: Vec::new(),
                    }
                    .to_string());
                }
                config::from_workflow(&file, &self.env, &mut self.secrets)
                    .map_err(|e| e.to_string())
            })
            .and_then(|loaded| {
                for w in &loaded.warnings {
                    log::warn!("{}", w.message);
                }
                crate::process::withhold(&loaded.settings.credential_vars);
                let settings = Arc::new(self.overrides.apply(loaded.settings, &self.env));
                let tracker = tracker::build_keeping(&settings.tracker, &self.env, &self.facts)
                    .map_err(|e| e.to_string())?;
                Ok((settings, Arc::from(tracker)))
            });
        match result {
            Ok((settings, tracker)) => {
                log::info!("reloaded {}", self.path.display());
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Loaded {
                    settings: Arc::clone(&settings),
                    tracker,
                    text,
                };
                let _ = events.send(Event::Reloaded(settings));
            }
            Err(e) => {
                log::warn!("workflow reload failed, keeping the last good settings: {e}");
                // Remember the broken text so the same error is not re-reported every poll.
                self.current.lock().unwrap_or_else(|p| p.into_inner()).text = text;
                let _ = events.send(Event::ReloadFailed(e.replace('\n', " ")));
            }
        }
    }

    /// Asks the tracker for steering messages on `issues` since its cursor; the event to send
    /// when anything came or the cursor moved.
    fn steering(
        &mut self,
        tracker: &dyn Tracker,
        issues: &[tracker::Issue],
        polled_at: std::time::SystemTime,
        waiting: &[crate::steering::Message],
    ) -> Option<Event> {
        let source = tracker.steering_source()?;
        let cursor = self.steering_cursors.get(&source).cloned();
        match tracker.steering_waiting(issues, cursor.as_deref(), polled_at, waiting) {
            Ok(batch) => {
                self.steering_error = None;
                let moved = batch.cursor.is_some() && batch.cursor != cursor;
                if let Some(c) = &batch.cursor {
                    self.steering_cursors.insert(source.clone(), c.clone());
                }
                (moved
                    || !batch.messages.is_empty()
                    || !batch.ignored.is_empty()
                    || !batch.held.is_empty())
                .then(|| Event::Steer {
                    messages: batch.messages,
                    cursor: batch.cursor.map(|c| (source, c)),
                    ignored: batch.ignored,
                    held: batch.held,
                })
            }
            Err(e) => {
                let message = format!("steering from {source} failed: {e}");
                if self.steering_error.as_ref() != Some(&message) {
                    log::warn!("{message}; trying again at the next poll");
                    self.steering_error = Some(message);
                }
                None
            }
        }
    }

    /// The poller thread's loop.
    pub fn run(mut self, jobs: Receiver<PollJob>, events: Sender<Event>) {
        let wake_tx = events.clone();
        let wake: tracker::Wake = Arc::new(move || {
            let _ = wake_tx.send(Event::Wake);
        });
        for job in jobs {
            // What to answer if the job panics: the poll or fetch must still end, or the state
            // thread waits for it for ever (`polling.in_flight` stuck).
            let unfinished = match &job {
                PollJob::Poll { ids, .. } => Some(Err(ids.clone())),
                PollJob::Fetch(key) => Some(Ok(key.clone())),
                PollJob::SteeringCursors(_) => None,
            };
            self.answered = false;
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.job(job, &events, &wake)
            }));
            match done {
                Ok(true) => {}
                Ok(false) => return,
                Err(panic) => {
                    let why = panic_text(panic.as_ref());
                    let message = format!(
                        "the poller thread panicked ({why}); it goes on with the next poll"
                    );
                    log::error!("{message}");
                    let _ = events.send(Event::Notice {
                        event: "poller_restarted".into(),
                        message: message.clone(),
                    });
                    let answer = match unfinished.filter(|_| !self.answered) {
                        Some(Err(requested)) => Event::PollDone(PollReport {
                            candidates: Err(message.clone()),
                            refreshed: Err(message),
                            requested,
                            terminal: None,
                            rate_limits: None,
                            duration_ms: 0,
                            read_at: 0,
                        }),
                        Some(Ok(key)) => Event::RetryFetched {
                            key,
                            result: Err(message),
                        },
                        None => continue,
                    };
                    if events.send(answer).is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// One job of the poller thread; false when the state thread is gone.
    fn job(&mut self, job: PollJob, events: &Sender<Event>, wake: &tracker::Wake) -> bool {
        match job {
            PollJob::Poll {
                ids,
                include_terminal,
                steer,
                waiting,
            } => {
                self.reload(events);
                let started = Instant::now();
                let polled_at = std::time::SystemTime::now();
                let read_at = crate::time::unix_ms();
                let tracker = current_tracker(&self.current);
                tracker.attach(wake);
                let candidates = tracker.fetch_candidates().map_err(|e| e.to_string());
                let refreshed = if ids.is_empty() {
                    Ok(Vec::new())
                } else {
                    tracker
                        .fetch_states_after_candidates(&ids)
                        .map_err(|e| e.to_string())
                };
                let terminal = if include_terminal {
                    tracker.fetch_terminal().ok()
                } else {
                    None
                };
                if let Err(e) = &candidates {
                    log::warn!("tracker poll failed: {e}");
                }
                let rate_limits = tracker.rate_limits();
                let report = PollReport {
                    candidates,
                    refreshed,
                    requested: ids,
                    terminal,
                    rate_limits,
                    duration_ms: started.elapsed().as_millis() as u64,
                    read_at,
                };
                // Steering is read only for the issues that can take it, and only from a
                // tracker that is a source (no copy of the candidates otherwise).
                let steered: Option<Vec<tracker::Issue>> =
                    (report.candidates.is_ok() && tracker.steering_source().is_some()).then(|| {
                        let mut seen = std::collections::HashSet::new();
                        report
                            .refreshed
                            .iter()
                            .flatten()
                            .chain(report.candidates.iter().flatten())
                            .filter(|i| steer.contains(&i.id) && seen.insert(i.id.clone()))
                            .cloned()
                            .collect()
                    });
                if events.send(Event::PollDone(report)).is_err() {
                    return false;
                }
                self.answered = true;
                if let Some(issues) = steered
                    && let Some(event) =
                        self.steering(tracker.as_ref(), &issues, polled_at, &waiting)
                {
                    let _ = events.send(event);
                }
            }
            PollJob::SteeringCursors(cursors) => self.steering_cursors = cursors,
            PollJob::Fetch(key) => {
                let tracker = current_tracker(&self.current);
                let id = &key.issue_id;
                let result = tracker
                    .fetch_states_by_ids(std::slice::from_ref(id))
                    .map(|list| list.into_iter().find(|i| &i.id == id))
                    .map_err(|e| e.to_string());
                if events.send(Event::RetryFetched { key, result }).is_err() {
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A tracker whose first candidate read panics (outside input it did not expect).
    struct Panics(AtomicBool);

    impl Tracker for Panics {
        fn fetch_candidates(&self) -> Result<Vec<tracker::Issue>, tracker::TrackerError> {
            if !self.0.swap(true, Ordering::SeqCst) {
                panic!("a header nobody expected");
            }
            Ok(Vec::new())
        }
        fn fetch_states_by_ids(
            &self,
            _ids: &[String],
        ) -> Result<Vec<tracker::Issue>, tracker::TrackerError> {
            Ok(Vec::new())
        }
        fn fetch_terminal(&self) -> Result<Vec<tracker::Issue>, tracker::TrackerError> {
            Ok(Vec::new())
        }
    }

    /// A panic in a poll is survived: the poll is answered (failed, so `in_flight` clears),
    /// `poller_restarted` is said, and the next poll runs as usual.
    #[test]
    fn a_panicking_poll_is_answered_said_and_the_next_one_runs() {
        let dir = std::env::temp_dir().join(format!("svc-poller-panic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("WORKFLOW.md");
        std::fs::write(&path, "---\ntracker:\n  kind: memory\n---\nx\n").unwrap();
        let env = Arc::new(Env::from_pairs([("HOME", "/h")], &dir));
        let (poller, _) =
            Poller::start(path, env, Overrides::default(), Default::default()).unwrap();
        poller.current().lock().unwrap().tracker = Arc::new(Panics(AtomicBool::new(false)));
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded();
        let (events_tx, events_rx) = crossbeam_channel::unbounded();
        let thread = std::thread::spawn(move || poller.run(jobs_rx, events_tx));
        let poll = || PollJob::Poll {
            ids: vec!["id-1".into()],
            include_terminal: false,
            steer: Default::default(),
            waiting: Vec::new(),
        };
        let next = || {
            events_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("the poller answers")
        };
        jobs_tx.send(poll()).unwrap();
        match next() {
            Event::Notice { event, message } => {
                assert_eq!(event, "poller_restarted");
                assert!(message.contains("a header nobody expected"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        match next() {
            Event::PollDone(report) => {
                assert!(report.candidates.is_err());
                assert_eq!(report.requested, ["id-1".to_string()]);
            }
            other => panic!("{other:?}"),
        }
        jobs_tx.send(poll()).unwrap();
        match next() {
            Event::PollDone(report) => assert!(report.candidates.is_ok()),
            other => panic!("{other:?}"),
        }
        drop(jobs_tx);
        thread.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
