// The launcher ABI's types, shared by every launcher in a program (guarded: a dispatcher holding
// several kernels defines them once, at file scope).
#ifndef GEMMGEN_LAUNCH_TYPES
#define GEMMGEN_LAUNCH_TYPES
// What one launch needs (<launcher>_describe): its grid, and the workspace the launcher lends it.
typedef struct {
    unsigned grid[3];                   // blocks along x, y, z
    unsigned long long flag_words;      // 4-byte flags, zero before the launch, left zero by it
    unsigned long long partial_bytes;   // scratch for partial sums
    unsigned long long packed_a_bytes;  // A's zero-padded, aligned copy (0: A is read in place)
    unsigned long long packed_b_bytes;  // B's copy, after A's (0: B is read in place)
    int stores_c;                       // 1: C is stored through TMA (its tensor map is built)
} gemmgen_launch_info;

// The workspace a launcher holds for one stream of the current device (<launcher>_held).
typedef struct {
    void* flags;
    unsigned long long flag_bytes;
    void* partials;
    unsigned long long partial_bytes;
    void* packed;
    unsigned long long packed_bytes;
} gemmgen_held;
#endif
