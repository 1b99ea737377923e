"""What the decode role (asym-decode, D) adds to SGLang: destinations for the prefix B, the window step over
[B, N) under the budget policy, and the recompute fallback for a failed transfer."""
