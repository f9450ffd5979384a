//! The seccomp filter of agent sandboxes, compiled with seccompiler and handed to bubblewrap
//! (`--seccomp FD`), which loads it last, just before it starts the terminal: everything the
//! agent runs carries it, and nothing can remove it.
//!
//! Every listed call fails with `EPERM`; everything else is allowed (the sandbox's namespaces,
//! mounts, identity and `no_new_privs` do the rest). What is refused, and why:
//!
//! | calls | why |
//! |---|---|
//! | `ioctl(TIOCSTI)`, `ioctl(TIOCLINUX)` | typing into a terminal the agent does not own (its own PTY's owner, or a console) |
//! | `ptrace`, `process_vm_readv`, `process_vm_writev`, `pidfd_getfd` | reading, steering or robbing other processes of the sandbox: `ctxterm`, which holds the PTY, the terminal socket and the caller's streams, and the sandbox's pid 1 (ctxterm is undumpable too, in every mode) |
//! | `io_uring_setup`, `io_uring_enter`, `io_uring_register` | a second way to make every file and socket call, which this filter cannot see into, and a large kernel attack surface |
//! | `chmod`, `fchmod`, `fchmodat`, `fchmodat2` with `S_ISUID` or `S_ISGID` in the mode; `open`, `openat`, `creat`, `mkdir`, `mkdirat`, `mknod`, `mknodat` with either in the mode | a setuid or setgid file left on the host, where no sandbox's `nosuid` mount applies (`openat2`, which keeps its mode behind a pointer, fails with `ENOSYS`, below) |
//! | `keyctl`, `add_key`, `request_key` | the kernel keyrings are not namespaced: keys of the same uid elsewhere |
//! | `bpf`, `perf_event_open`, `userfaultfd` | kernel attack surface and side channels that agents have no use for |
//! | `kexec_load`, `kexec_file_load`, `reboot`, `init_module`, `finit_module`, `delete_module`, `swapon`, `swapoff`, `acct`, `quotactl`, `syslog`, `iopl`, `ioperm` | the host's kernel and devices |
//! | `mount`, `umount2`, `pivot_root`, `move_mount`, `open_tree`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr` | the sandbox's file system is the launcher's: `/ctx`, `/workspace` and the mount table stay as bound |
//! | `setns`, `unshare` with `CLONE_NEWUSER` (`--disable-userns` too), `clone` with `CLONE_NEWUSER` | no new user namespace, where all of the above would come back as capabilities |
//! | `open_by_handle_at`, `name_to_handle_at` | opening files by handle goes around paths and mounts |
//! | `settimeofday`, `clock_settime`, `clock_adjtime`, `adjtimex` | the host's clock |
//! | `personality`, `uselib`, `vhangup`, `lookup_dcookie`, `nfsservctl` | obsolete or host-wide |
//! | any x32 system call (number with bit 30 set), any non-x86-64 architecture (killed) | the same calls under other numbers |
//!
//! `clone3` cannot be filtered on its flags (they are behind a pointer), so it fails with
//! `ENOSYS` and C libraries fall back to `clone`, whose flags are checked. `openat2` keeps its
//! mode behind a pointer too: it fails with `ENOSYS`, and programs fall back to `openat`, whose
//! mode is checked (the core tools then confine their paths beneath the workspace one
//! component at a time).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch, sock_filter,
};

/// `TIOCSTI`: push a byte into a terminal's input.
const TIOCSTI: u64 = 0x5412;
/// `TIOCLINUX`: the Linux console's multiplexed ioctl (includes pasting a selection).
const TIOCLINUX: u64 = 0x541C;
/// `fchmodat2` (Linux 6.6), which the libc crate may not name.
const SYS_FCHMODAT2: i64 = 452;
/// x32 system calls are numbered from here.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The calls refused whatever their arguments.
const REFUSED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_pidfd_getfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_personality,
    libc::SYS_uselib,
    libc::SYS_vhangup,
    libc::SYS_lookup_dcookie,
    libc::SYS_nfsservctl,
];

/// Why the filter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the sandbox's seccomp filter: {0}")]
pub struct Error(String);

fn built<T>(r: Result<T, impl std::fmt::Display>) -> Result<T, Error> {
    r.map_err(|e| Error(e.to_string()))
}

/// A rule matching when argument `arg`, of `len`, compares to `value` by `op`.
fn arg_is(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, Error> {
    let c = built(SeccompCondition::new(arg, len, op, value))?;
    built(SeccompRule::new(vec![c]))
}

/// The filter as bubblewrap reads it from `--seccomp FD`: the program's `struct sock_filter`
/// array, in native byte order.
pub fn program() -> Result<Vec<u8>, Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = REFUSED.iter().map(|&n| (n, Vec::new())).collect();
    rules.insert(
        libc::SYS_ioctl,
        // The kernel reads the request as a 32-bit `unsigned int`: so does the filter, or
        // high bits would hide it.
        vec![
            arg_is(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, TIOCSTI)?,
            arg_is(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, TIOCLINUX)?,
        ],
    );
    let newuser = libc::CLONE_NEWUSER as u64;
    let newuser_rule = || arg_is(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(newuser), newuser);
    rules.insert(libc::SYS_unshare, vec![newuser_rule()?]);
    // A mode (argument `arg`) with the setuid or the setgid bit is refused.
    let setid = |arg: u8| -> Result<Vec<SeccompRule>, Error> {
        let bit = |b: u64| arg_is(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(b), b);
        Ok(vec![bit(u64::from(libc::S_ISUID))?, bit(u64::from(libc::S_ISGID))?])
    };
    for (call, arg) in [
        (libc::SYS_chmod, 1),
        (libc::SYS_fchmod, 1),
        (libc::SYS_fchmodat, 2),
        (SYS_FCHMODAT2, 2),
        (libc::SYS_open, 2),
        (libc::SYS_openat, 3),
        (libc::SYS_creat, 1),
        (libc::SYS_mkdir, 1),
        (libc::SYS_mkdirat, 2),
        (libc::SYS_mknod, 1),
        (libc::SYS_mknodat, 2),
    ] {
        rules.insert(call, setid(arg)?);
    }
    rules.insert(libc::SYS_clone, vec![newuser_rule()?]);
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let filter = built(SeccompFilter::new(rules, SeccompAction::Allow, eperm, TargetArch::x86_64))?;
    let mut prog: BpfProgram = built(filter.try_into())?;
    // clone3 carries its flags in memory the filter cannot read: ENOSYS makes libc use clone.
    // seccompiler's rules map one action for all matches, so these few instructions are ours,
    // after its architecture check (three instructions; jumps are relative, so inserting
    // before the rest moves none of them).
    let ld_nr = libc::BPF_LD as u16 | libc::BPF_W as u16 | libc::BPF_ABS as u16;
    let jeq = libc::BPF_JMP as u16 | libc::BPF_JEQ as u16 | libc::BPF_K as u16;
    let jge = libc::BPF_JMP as u16 | libc::BPF_JGE as u16 | libc::BPF_K as u16;
    let ret = libc::BPF_RET as u16 | libc::BPF_K as u16;
    let errno = |e: i32| libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA);
    // openat2 likewise carries its mode (a setuid file) in memory: ENOSYS, and the core tools
    // resolve their paths beneath the workspace without it.
    let ours = [
        sock_filter { code: ld_nr, jt: 0, jf: 0, k: 0 },
        sock_filter { code: jge, jt: 3, jf: 0, k: X32_SYSCALL_BIT },
        sock_filter { code: jeq, jt: 1, jf: 0, k: libc::SYS_clone3 as u32 },
        sock_filter { code: jeq, jt: 0, jf: 2, k: libc::SYS_openat2 as u32 },
        sock_filter { code: ret, jt: 0, jf: 0, k: errno(libc::ENOSYS) },
        sock_filter { code: ret, jt: 0, jf: 0, k: errno(libc::EPERM) },
    ];
    if prog.len() < 3 {
        return Err(Error("seccompiler produced no architecture check".into()));
    }
    // x32 numbers jump to the EPERM return; clone3 and openat2 to ENOSYS; the rest to
    // seccompiler's rules.
    prog.splice(3..3, ours);
    Ok(prog
        .iter()
        .flat_map(|f| {
            let mut b = [0u8; 8];
            b[..2].copy_from_slice(&f.code.to_ne_bytes());
            b[2] = f.jt;
            b[3] = f.jf;
            b[4..].copy_from_slice(&f.k.to_ne_bytes());
            b
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_builds_and_fits_the_kernels_limit() {
        let p = program().unwrap();
        assert_eq!(p.len() % 8, 0);
        assert!(p.len() / 8 < 4096, "BPF_MAXINSNS");
    }
}
