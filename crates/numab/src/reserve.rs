//! Frames for the fault handler, which may not take the zone lock or touch the global heap:
//! per-node reserves of allocated frames, filled by the balancer's thread outside signal
//! context, and a stack of frames to free, pushed by handlers and emptied by that thread.
//!
//! Both are lock-free and allocation-free on the handler's side: a reserve is a bounded
//! `ArrayQueue` (handlers only pop, the balancer's thread only pushes), and the free stack
//! links frames through their own first word (a frame on it is mapped nowhere but the arena),
//! pushed with a CAS and taken whole with one swap, so no pop can meet the ABA problem.

use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One node's reserve: arena addresses of allocated frames, zeroed.
pub struct Reserve {
    frames: ArrayQueue<usize>,
    cap: usize,
}

impl Reserve {
    /// An empty reserve of at most `cap` frames (0: a reserve that stays empty).
    pub fn new(cap: usize) -> Reserve {
        Reserve { frames: ArrayQueue::new(cap.max(1)), cap }
    }

    /// Takes a frame (async-signal-safe).
    #[inline]
    pub fn take(&self) -> Option<usize> {
        self.frames.pop()
    }

    /// Adds a frame; gives it back when the reserve is full.
    pub fn put(&self, frame: usize) -> Result<(), usize> {
        if self.frames.len() >= self.cap {
            return Err(frame);
        }
        self.frames.push(frame)
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Most frames held.
    pub fn capacity(&self) -> usize {
        self.cap
    }
}

/// One node's reserve, split into a slot per CPU (up to 16): a thread takes from its CPU's
/// slot first, so frames a slot was filled with in order reach one thread in order, and the
/// pages it touches in order map consecutive frames (their mappings merge), where threads
/// taking turns on one queue would interleave them.
pub struct NodeReserve {
    slots: Box<[Reserve]>,
}

impl NodeReserve {
    /// `cap` frames over `slots` slots (each at least one frame).
    pub fn new(cap: usize, slots: usize) -> NodeReserve {
        let slots = slots.clamp(1, 16);
        NodeReserve { slots: (0..slots).map(|_| Reserve::new(cap.div_ceil(slots).max(1))).collect() }
    }

    /// Takes a frame, from slot `cpu % slots` first, then any other (async-signal-safe).
    #[inline]
    pub fn take(&self, cpu: usize) -> Option<usize> {
        let n = self.slots.len();
        (0..n).find_map(|k| self.slots[(cpu + k) % n].take())
    }

    /// The slots, for refills.
    pub fn slots(&self) -> &[Reserve] {
        &self.slots
    }

    /// Frames held in every slot.
    pub fn len(&self) -> usize {
        self.slots.iter().map(Reserve::len).sum()
    }

    /// Most frames held.
    pub fn capacity(&self) -> usize {
        self.slots.iter().map(Reserve::capacity).sum()
    }
}

/// Frames waiting to be freed.
#[derive(Default)]
pub struct FreeStack {
    head: AtomicUsize,
}

impl FreeStack {
    /// Pushes a frame (async-signal-safe).
    ///
    /// # Safety
    /// `frame` is the arena address of an allocated frame that nothing else uses or maps:
    /// its first word becomes the link.
    pub unsafe fn push(&self, frame: usize) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: the frame is ours alone and mapped in the arena (the caller's contract).
            unsafe { (frame as *mut usize).write(head) };
            match self.head.compare_exchange_weak(head, frame, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Takes every frame pushed so far.
    pub fn take_all(&self) -> Vec<usize> {
        let mut cur = self.head.swap(0, Ordering::Acquire);
        let mut out = Vec::new();
        while cur != 0 {
            out.push(cur);
            // SAFETY: every frame on the stack was pushed with its link in its first word,
            // and the swap made this thread the only reader of the chain.
            cur = unsafe { (cur as *const usize).read() };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_stack_takes_everything_pushed_from_many_threads() {
        let frames: Vec<Box<[usize; 512]>> = (0..64).map(|_| Box::new([0usize; 512])).collect();
        let addrs: Vec<usize> = frames.iter().map(|f| f.as_ptr() as usize).collect();
        let s = FreeStack::default();
        std::thread::scope(|sc| {
            for chunk in addrs.chunks(16) {
                let s = &s;
                // SAFETY: each buffer is pushed once and read only through the stack.
                sc.spawn(move || chunk.iter().for_each(|&a| unsafe { s.push(a) }));
            }
        });
        let mut got = s.take_all();
        got.sort_unstable();
        let mut want = addrs.clone();
        want.sort_unstable();
        assert_eq!(got, want);
        assert!(s.take_all().is_empty());
    }

    #[test]
    fn a_full_reserve_gives_the_frame_back() {
        let r = Reserve::new(2);
        assert_eq!(r.put(1), Ok(()));
        assert_eq!(r.put(2), Ok(()));
        assert_eq!(r.put(3), Err(3));
        assert_eq!((r.take(), r.take(), r.take()), (Some(1), Some(2), None));
    }
}
