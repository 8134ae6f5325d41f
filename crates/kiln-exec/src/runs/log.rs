//! A run's event log: everything a watcher can see of a run, in order, kept
//! once per run and read by any number of subscribers through cursors.
//!
//! Output is stored as text per stream (stdout, stderr) plus a list of
//! items recording the order in which the streams were written; an output
//! item only grows while it is the last one. A subscriber reads at most
//! [`CHUNK`] bytes at a time from where it is, so an event never exceeds a
//! few KiB, a late subscriber replays everything from the start, and a slow
//! subscriber costs nothing but its cursor: nothing is buffered per
//! subscriber. The whole log is bounded by the run's output caps (its text
//! is exactly the captured output) plus 16 bytes per stream switch.
//!
//! Bytes become text as they arrive: a multi-byte character split across
//! two reads waits for its end, an invalid sequence becomes U+FFFD exactly
//! as `String::from_utf8_lossy` would make it, so the concatenated chunks
//! of a stream equal the result's text.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::types::{ExecError, ExecResult, OutputFile};

/// Largest text chunk one output event carries, in bytes.
pub const CHUNK: usize = 4096;

/// Which step of an execution started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Compile,
    Run,
}

impl Step {
    pub fn as_str(&self) -> &'static str {
        match self {
            Step::Compile => "compile",
            Step::Run => "run",
        }
    }
}

/// One output stream of the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout = 0,
    Stderr = 1,
}

impl Stream {
    /// `stdout` or `stderr`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// What a subscriber sees, in order.
///
/// `non_exhaustive`: later kinds of runs may add events.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RunEvent {
    /// The run waits for an execution slot; `position` runs are ahead.
    Queued { position: usize },
    /// A step began (a jail is running the program or the compiler).
    Started { step: Step },
    /// Program output, in the order it was written (at most [`CHUNK`]
    /// bytes of UTF-8 text).
    Output { stream: Stream, text: String },
    /// An output file was stored.
    File(OutputFile),
    /// A programmatic run paused for these tool calls (one round); it
    /// resumes when the host posts their results ([`crate::ptc`]).
    ToolCalls(Vec<crate::ptc::ToolCall>),
    /// The run is over. Always the last event.
    Done(Arc<Result<ExecResult, ExecError>>),
}

#[derive(Debug)]
enum Item {
    /// Text of `stream` up to byte `end`.
    Out {
        stream: Stream,
        end: usize,
    },
    Event(Box<RunEvent>),
}

#[derive(Debug, Default)]
struct State {
    text: [String; 2],
    /// Bytes of an incomplete character at the end of each stream.
    pending: [Vec<u8>; 2],
    items: Vec<Item>,
    done: bool,
}

/// The log of one run. Writers append; subscribers read.
#[derive(Debug)]
pub struct EventLog {
    state: Mutex<State>,
    /// Bumped after every append; subscribers wait on it.
    version: watch::Sender<u64>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            state: Mutex::new(State::default()),
            version: watch::Sender::new(0),
        }
    }
}

impl EventLog {
    pub fn new() -> Arc<EventLog> {
        Arc::new(EventLog::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Appends an event (not output: see [`EventLog::output`]; not the end:
    /// see [`EventLog::finish`]). Ignored once the run is done.
    pub fn push(&self, event: RunEvent) {
        {
            let mut s = self.lock();
            if s.done {
                return;
            }
            s.items.push(Item::Event(Box::new(event)));
        }
        self.bump();
    }

    /// Appends program output as it was read (any bytes).
    pub fn output(&self, stream: Stream, bytes: &[u8]) {
        {
            let mut s = self.lock();
            if s.done || bytes.is_empty() {
                return;
            }
            let i = stream as usize;
            let mut data = std::mem::take(&mut s.pending[i]);
            data.extend_from_slice(bytes);
            let before = s.text[i].len();
            let pending = decode_into(&data, &mut s.text[i]);
            s.pending[i] = pending;
            if s.text[i].len() > before {
                s.extend(stream);
            }
        }
        self.bump();
    }

    /// Ends the log: a split character left at the end of a stream becomes
    /// U+FFFD, then `Done`.
    pub fn finish(&self, outcome: Result<ExecResult, ExecError>) {
        {
            let mut s = self.lock();
            if s.done {
                return;
            }
            for stream in [Stream::Stdout, Stream::Stderr] {
                let i = stream as usize;
                if !s.pending[i].is_empty() {
                    s.pending[i].clear();
                    s.text[i].push(char::REPLACEMENT_CHARACTER);
                    s.extend(stream);
                }
            }
            s.items
                .push(Item::Event(Box::new(RunEvent::Done(Arc::new(outcome)))));
            s.done = true;
        }
        self.bump();
    }

    /// The outcome, once done.
    pub fn outcome(&self) -> Option<Arc<Result<ExecResult, ExecError>>> {
        let s = self.lock();
        match s.items.last() {
            Some(Item::Event(e)) => match &**e {
                RunEvent::Done(o) => Some(Arc::clone(o)),
                _ => None,
            },
            _ => None,
        }
    }

    /// The text written to `stream` so far.
    pub fn text(&self, stream: Stream) -> String {
        self.lock().text[stream as usize].clone()
    }

    /// Roughly the memory the log holds, in bytes.
    pub fn size(&self) -> usize {
        let s = self.lock();
        s.text[0].len() + s.text[1].len() + s.items.len() * std::mem::size_of::<Item>()
    }

    /// A reader from the first event on.
    pub fn subscribe(self: &Arc<Self>) -> Subscriber {
        Subscriber {
            log: Arc::clone(self),
            rx: self.version.subscribe(),
            item: 0,
            pos: [0, 0],
            ended: false,
        }
    }
}

impl State {
    /// The text of `stream` grew: the last item covers it (a new item when
    /// the other stream wrote last).
    fn extend(&mut self, stream: Stream) {
        let end = self.text[stream as usize].len();
        match self.items.last_mut() {
            Some(Item::Out { stream: s, end: e }) if *s == stream => *e = end,
            _ => self.items.push(Item::Out { stream, end }),
        }
    }
}

/// Appends the text of `data` to `out` as `String::from_utf8_lossy` would
/// decode it, except for an incomplete character at the very end, whose
/// bytes are returned (to be completed by the next read).
fn decode_into(mut data: &[u8], out: &mut String) -> Vec<u8> {
    loop {
        match std::str::from_utf8(data) {
            Ok(s) => {
                out.push_str(s);
                return Vec::new();
            }
            Err(e) => {
                let (valid, rest) = data.split_at(e.valid_up_to());
                // valid by from_utf8's own account
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    // the input ends inside a character: keep its bytes
                    None => return rest.to_vec(),
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        data = &rest[n..];
                    }
                }
            }
        }
    }
}

/// Reads a log from the start, at its own pace.
#[derive(Debug)]
pub struct Subscriber {
    log: Arc<EventLog>,
    rx: watch::Receiver<u64>,
    item: usize,
    pos: [usize; 2],
    ended: bool,
}

impl Subscriber {
    /// The next event; `None` after `Done` was returned.
    pub async fn next(&mut self) -> Option<RunEvent> {
        loop {
            if self.ended {
                return None;
            }
            // mark the current version seen before looking, so an append
            // after the look wakes the wait below
            self.rx.borrow_and_update();
            if let Some(ev) = self.try_next() {
                if matches!(ev, RunEvent::Done(_)) {
                    self.ended = true;
                }
                return Some(ev);
            }
            if self.rx.changed().await.is_err() {
                // the log is gone without an end (cannot happen while we
                // hold it); look once more
                return self.try_next();
            }
        }
    }

    /// The next event if one is there now.
    pub fn try_next(&mut self) -> Option<RunEvent> {
        let s = self.log.lock();
        loop {
            let item = s.items.get(self.item)?;
            match item {
                Item::Event(e) => {
                    self.item += 1;
                    return Some((**e).clone());
                }
                Item::Out { stream, end } => {
                    let i = *stream as usize;
                    let from = self.pos[i];
                    if from < *end {
                        let text = &s.text[i];
                        let mut to = (*end).min(from + CHUNK);
                        while !text.is_char_boundary(to) {
                            to -= 1;
                        }
                        self.pos[i] = to;
                        return Some(RunEvent::Output {
                            stream: *stream,
                            text: text[from..to].to_owned(),
                        });
                    }
                    // all of this item read: on to the next, unless it may
                    // still grow (it is the last)
                    if self.item + 1 < s.items.len() {
                        self.item += 1;
                    } else {
                        return None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(sub: &mut Subscriber) -> Vec<RunEvent> {
        std::iter::from_fn(|| sub.try_next()).collect()
    }

    fn texts(events: &[RunEvent], stream: Stream) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                RunEvent::Output { stream: s, text } if *s == stream => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn subscribers_see_events_in_order_and_late_ones_see_everything() {
        let log = EventLog::new();
        let mut early = log.subscribe();
        log.push(RunEvent::Queued { position: 0 });
        log.push(RunEvent::Started { step: Step::Run });
        log.output(Stream::Stdout, b"one\n");
        let seen = drain(&mut early);
        assert_eq!(seen.len(), 3);
        log.output(Stream::Stdout, b"two\n");
        log.output(Stream::Stderr, b"oops\n");
        log.output(Stream::Stdout, b"three\n");
        let more = drain(&mut early);
        // the growing stdout item yields only what is new
        assert_eq!(texts(&more, Stream::Stdout), "two\nthree\n");
        assert_eq!(texts(&more, Stream::Stderr), "oops\n");
        let mut late = log.subscribe();
        let all = drain(&mut late);
        assert_eq!(texts(&all, Stream::Stdout), "one\ntwo\nthree\n");
        let order: Vec<_> = all
            .iter()
            .filter_map(|e| match e {
                RunEvent::Output { stream, .. } => Some(*stream),
                _ => None,
            })
            .collect();
        assert_eq!(order, [Stream::Stdout, Stream::Stderr, Stream::Stdout]);
    }

    #[test]
    fn chunks_are_at_most_chunk_bytes_and_split_only_between_characters() {
        let log = EventLog::new();
        let text = "é".repeat(5000); // 10 000 bytes
        log.output(Stream::Stdout, text.as_bytes());
        let mut sub = log.subscribe();
        let events = drain(&mut sub);
        assert!(events.len() >= 3);
        for e in &events {
            if let RunEvent::Output { text, .. } = e {
                assert!(text.len() <= CHUNK);
            }
        }
        assert_eq!(texts(&events, Stream::Stdout), text);
    }

    #[test]
    fn a_character_split_across_reads_arrives_whole_and_bad_bytes_match_lossy_decoding() {
        let log = EventLog::new();
        let bytes = "ok ✓ done".as_bytes();
        let cut = 4; // inside the 3-byte check mark
        log.output(Stream::Stdout, &bytes[..cut]);
        let mut sub = log.subscribe();
        assert_eq!(texts(&drain(&mut sub), Stream::Stdout), "ok ");
        log.output(Stream::Stdout, &bytes[cut..]);
        assert_eq!(texts(&drain(&mut sub), Stream::Stdout), "✓ done");

        let bad: &[u8] = b"a\xffb\xe2\x82";
        let log = EventLog::new();
        for b in bad {
            log.output(Stream::Stderr, std::slice::from_ref(b));
        }
        log.finish(Err(ExecError::Cancelled));
        assert_eq!(log.text(Stream::Stderr), String::from_utf8_lossy(bad));
    }

    #[tokio::test]
    async fn next_waits_for_appends_and_ends_after_done() {
        let log = EventLog::new();
        let mut sub = log.subscribe();
        let writer = {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                log.output(Stream::Stdout, b"late");
                log.finish(Err(ExecError::Cancelled));
            })
        };
        let first = sub.next().await;
        assert!(matches!(first, Some(RunEvent::Output { ref text, .. }) if text == "late"));
        assert!(matches!(sub.next().await, Some(RunEvent::Done(_))));
        assert!(sub.next().await.is_none());
        writer.await.unwrap();
        assert!(log.outcome().is_some());
    }

    #[test]
    fn nothing_is_appended_after_done() {
        let log = EventLog::new();
        log.finish(Err(ExecError::ShuttingDown));
        log.output(Stream::Stdout, b"x");
        log.push(RunEvent::Queued { position: 1 });
        let mut sub = log.subscribe();
        let events = drain(&mut sub);
        assert_eq!(events.len(), 1);
    }

    #[test]
    fn many_stream_switches_cost_a_small_item_each() {
        let log = EventLog::new();
        for i in 0..10_000 {
            let s = if i % 2 == 0 {
                Stream::Stdout
            } else {
                Stream::Stderr
            };
            log.output(s, b"x");
        }
        assert!(log.size() <= 10_000 + 10_000 * 24, "{}", log.size());
    }
}
