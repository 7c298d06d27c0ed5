//! `map_large_allocations` in a process of its own: glibc's counters are
//! process-wide, so no other test may allocate meanwhile.

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn a_freed_large_block_goes_back_and_the_next_is_mapped_again() {
    /// Bytes glibc holds in blocks mapped on their own.
    fn mapped() -> usize {
        // SAFETY: `mallinfo2` only reads the allocator's counters.
        unsafe { libc::mallinfo2() }.hblkhd
    }
    const BLOCK: usize = 4 << 20;
    assert!(
        lm_model::map_large_allocations(),
        "glibc refused the threshold"
    );
    for round in 0..3 {
        let before = mapped();
        let block = std::hint::black_box(vec![1u8; BLOCK]);
        let during = mapped();
        assert!(
            during >= before + BLOCK,
            "round {round}: {before} -> {during}"
        );
        drop(block);
        let after = mapped();
        assert!(
            after + BLOCK <= during,
            "round {round}: freed, {during} -> {after}"
        );
    }
}
