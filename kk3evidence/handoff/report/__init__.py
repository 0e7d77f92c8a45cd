"""The hand-off document: markdown (the seed's checklist evaluated from evidence), HTML timeline,
and the Korean/English strings."""
