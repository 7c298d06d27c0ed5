//! The ordering the searches keep their best in: a bounded max-heap whose
//! top is the worst kept so far, so each newcomer is compared with it once.

use std::cmp::Ordering;

/// Values with a ranking, best first.
pub(crate) trait BestFirst {
    /// `Less` when `self` ranks before `other`.
    fn best_first(&self, other: &Self) -> Ordering;
}

/// A value ordered so that the worse one is the greater: the top of a
/// [`std::collections::BinaryHeap`] of them is the one to drop, and its
/// ascending order is the ranking.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorstOnTop<T>(pub(crate) T);

impl<T: BestFirst> PartialEq for WorstOnTop<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<T: BestFirst> Eq for WorstOnTop<T> {}

impl<T: BestFirst> PartialOrd for WorstOnTop<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: BestFirst> Ord for WorstOnTop<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.best_first(&other.0)
    }
}
