//! Freed memory kept for the shell's next query.
//!
//! glibc's `malloc` gives large freed blocks back to the kernel (blocks over
//! its mmap threshold are unmapped; the heap's free top is trimmed), so each
//! query of a session gets fresh pages that the kernel must fault in and
//! zero. For a training loop over a Parquet file that is most of the one
//! decode of the file (measured: 7x the page faults, 23% more CPU for
//! one-step loops over a 1M-row, 10-column file). Like datafusion-cli,
//! which links mimalloc for the same reason, `dfgrad` keeps freed memory for
//! reuse: blocks up to 32 MiB come from the heap (glibc's largest mmap
//! threshold), and up to 1 GiB of free heap is kept rather than trimmed.
//! A session's resident memory therefore stays near its largest query's,
//! up to that bound. A `GLIBC_TUNABLES` that sets any `glibc.malloc`
//! tunable is left to rule instead.

/// glibc's `mallopt` parameters (`<malloc.h>`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::ffi::c_int;

    pub const M_TRIM_THRESHOLD: c_int = -1;
    pub const M_MMAP_THRESHOLD: c_int = -3;

    extern "C" {
        pub fn mallopt(param: c_int, value: c_int) -> c_int;
    }
}

/// Keeps freed memory for reuse (see the [module docs](self)); call first
/// thing in `main`, before any other thread runs. Does nothing on other
/// platforms than Linux with glibc.
pub(crate) fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tuned = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
        if tuned {
            return;
        }
        // SAFETY: mallopt takes two integers and no pointers; glibc documents
        // it as unsafe only when it races other malloc calls (MT-Unsafe
        // init), and this runs at the start of main, before the process
        // starts another thread. A value glibc refuses leaves its default
        // (mallopt returns 0), so the outcome needs no check.
        unsafe {
            glibc::mallopt(glibc::M_MMAP_THRESHOLD, 32 << 20);
            glibc::mallopt(glibc::M_TRIM_THRESHOLD, 1 << 30);
        }
    }
}
