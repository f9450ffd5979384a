//! The uids and gids CortexFS gives agents created without `--uid`/`--gid`.
//!
//! Each such agent gets one number of its own from [`AGENT_IDS`], used as both its uid and its
//! gid, so that Linux identity keeps agents apart even where a policy is wrong. The range,
//! 1879113728-1879179263 (0x70010000-0x7001FFFF), lies in the block that systemd's
//! allocation rules leave unused (above the container ranges, which end at 1879048191, and
//! below the foreign and 2^31 ranges): no host account, dynamic user, container or
//! `/etc/subuid` default uses it.

use std::ops::RangeInclusive;

/// The agents' range.
pub const AGENT_IDS: RangeInclusive<u32> = 0x7001_0000..=0x7001_FFFF;

/// The lowest id of the range that `taken` does not hold; `None` when all are taken.
pub fn first_free(taken: impl Fn(u32) -> bool) -> Option<u32> {
    AGENT_IDS.into_iter().find(|&id| !taken(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_free_id() {
        assert_eq!(first_free(|_| false), Some(0x7001_0000));
        assert_eq!(first_free(|id| id < 0x7001_0003), Some(0x7001_0003));
        assert_eq!(first_free(|_| true), None);
    }
}
