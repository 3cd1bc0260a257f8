"""The arithmetic of a hardware challenge (docs/trust.md, "Hardware challenges"), shared
by the coordinator, which sizes challenges and checks answers, and the agent, which
computes them.

    X₀        rows of {-1, 0, 1} built from three seeded blocks (`chain.initial_rows`)
    Y_t     = X_t · B                           B: n×n of {-1, 0, 1}, n ≤ 2048
    Q_t     = fmod(Y_t, 4)                      the sign-keeping remainder, in {-3 … 3}
    X_{t+1} = ((Q_t + roll(Q_t, k_t·C)) mod 3) − 1

Every value is an integer of at most n in magnitude, so FP16 on a GPU, FP32 on a CPU
and NumPy's integers all give the same bits. After each step the node reports one
sketch per chunk of C rows (`chain.sketches`); the coordinator asks for a few chunks
and checks them (`chain.step_rows`), two bits an entry on the wire (`packing`).

`sizing` is plain Python, so the coordinator sizes a challenge without importing NumPy;
the other modules need NumPy. Nothing here knows who uses it.
"""
