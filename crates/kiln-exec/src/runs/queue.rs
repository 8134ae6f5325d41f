//! The execution queue: runs wait here, first come first served, for one of
//! a fixed number of execution permits. A real object with a length, so
//! faces can show a run's position and a bound can be put on it.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Semaphore, SemaphorePermit};

/// Runs waiting for, and holding, execution permits.
#[derive(Debug)]
pub struct RunQueue {
    permits: Semaphore,
    capacity: usize,
    waiting: AtomicUsize,
}

/// Held while a run executes; dropping it lets the next one in.
#[derive(Debug)]
pub struct QueuePermit<'a>(#[allow(dead_code)] SemaphorePermit<'a>);

/// The queue was closed (shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueClosed;

/// Counts a waiting run until it leaves the queue (admitted or gone).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RunQueue {
    /// A queue admitting `concurrency` runs at once (at least one).
    pub fn new(concurrency: usize) -> RunQueue {
        let capacity = concurrency.max(1);
        RunQueue {
            permits: Semaphore::new(capacity),
            capacity,
            waiting: AtomicUsize::new(0),
        }
    }

    /// Runs waiting for a permit.
    pub fn len(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs holding a permit.
    pub fn running(&self) -> usize {
        self.capacity - self.permits.available_permits()
    }

    /// Runs admitted at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Joins the queue: returns the number of runs ahead and a future that
    /// resolves when this run may execute (in arrival order). Dropping the
    /// future leaves the queue.
    pub fn enter(
        &self,
    ) -> (
        usize,
        impl std::future::Future<Output = Result<QueuePermit<'_>, QueueClosed>> + Send + '_,
    ) {
        let ahead = self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(&self.waiting);
        let fut = async move {
            let permit = self.permits.acquire().await.map_err(|_| QueueClosed);
            drop(waiting);
            permit.map(QueuePermit)
        };
        (ahead, fut)
    }

    /// Refuses every waiting and future entry.
    pub fn close(&self) {
        self.permits.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_are_admitted_in_order_up_to_the_capacity() {
        let q = RunQueue::new(1);
        let (ahead, first) = q.enter();
        assert_eq!(ahead, 0);
        let p1 = first.await.unwrap();
        assert_eq!((q.running(), q.len()), (1, 0));
        let (ahead2, second) = q.enter();
        let (ahead3, third) = q.enter();
        assert_eq!((ahead2, ahead3), (0, 1));
        assert_eq!(q.len(), 2);
        let mut second = Box::pin(second);
        let mut third = Box::pin(third);
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert!(futures::poll!(third.as_mut()).is_pending());
        drop(p1);
        let p2 = second.await.unwrap();
        assert!(futures::poll!(third.as_mut()).is_pending());
        assert_eq!(q.len(), 1);
        drop(p2);
        third.await.unwrap();
        assert_eq!(q.len(), 0);
    }

    #[tokio::test]
    async fn leaving_the_queue_and_closing_it() {
        let q = RunQueue::new(1);
        let _held = q.enter().1.await.unwrap();
        let (_, waiting) = q.enter();
        assert_eq!(q.len(), 1);
        drop(waiting);
        assert_eq!(q.len(), 0);
        let (_, waiting) = q.enter();
        q.close();
        assert_eq!(waiting.await.unwrap_err(), QueueClosed);
        assert!(q.is_empty());
    }
}
