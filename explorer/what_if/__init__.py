"""What-if: replay a recorded run on the simulator with one thing changed.

`replay` re-times a run (another chip, a compiled graph, other dtypes), `counterfactual`
gives a finding's saving by removing its cause (`kernel_retime` re-times the recorded
kernels without it), `compiled` replays eager ops as graphs,
`writer` writes the predicted trace, `label` says in reports that it is one and `options`
lists what a prediction can change.
"""
