//! gfp flags: what an allocation may do.
//!
//! Kernel counterpart: `gfp_t` (include/linux/gfp_types.h) and the `ALLOC_*` flags that
//! `gfp_to_alloc_flags` derives from it. zonal keeps the three that change where and how
//! deep an allocation may reach; reclaim and IO flags have no meaning here.

bitflags::bitflags! {
    /// Allocation flags. The empty set is `GFP_KERNEL`'s placement behaviour: the preferred
    /// node first, then the others by distance, stopping at the `low` watermark on the first
    /// pass and at `min` on the second.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Gfp: u32 {
        /// `__GFP_THISNODE`: the preferred node only, no fallback (`ZONELIST_NOFALLBACK`).
        const THISNODE = 1 << 0;
        /// `__GFP_HIGH` (`ALLOC_HIGH`): may go below `min`, down to half of it.
        const HIGH = 1 << 1;
        /// `__GFP_MEMALLOC` (`ALLOC_NO_WATERMARKS`): ignore watermarks entirely.
        const NO_WATERMARKS = 1 << 2;
    }
}

impl Gfp {
    /// `GFP_KERNEL`: no special rights.
    pub const KERNEL: Gfp = Gfp::empty();
    /// `GFP_ATOMIC`'s reserve access: may dip below `min`.
    pub const ATOMIC: Gfp = Gfp::HIGH;

    /// Parses `thisnode|high|nowatermarks` (also `kernel`, `atomic`, `0`), `|` or `,` separated.
    pub fn parse(s: &str) -> Result<Gfp, String> {
        let mut g = Gfp::empty();
        for part in s.split(['|', ',']).map(str::trim).filter(|p| !p.is_empty()) {
            g |= match part.to_ascii_lowercase().as_str() {
                "kernel" | "0" => Gfp::KERNEL,
                "atomic" => Gfp::ATOMIC,
                "thisnode" => Gfp::THISNODE,
                "high" => Gfp::HIGH,
                "nowatermarks" | "memalloc" => Gfp::NO_WATERMARKS,
                _ => {
                    return Err(format!(
                        "unknown gfp flag `{part}`; valid: kernel, atomic, thisnode, high, nowatermarks"
                    ))
                }
            };
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(Gfp::parse("thisnode|high").unwrap(), Gfp::THISNODE | Gfp::HIGH);
        assert_eq!(Gfp::parse("kernel").unwrap(), Gfp::empty());
        assert!(Gfp::parse("lazy").unwrap_err().contains("unknown gfp flag `lazy`"));
    }
}
