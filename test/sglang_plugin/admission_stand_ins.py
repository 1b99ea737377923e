"""The stand-in for SGLang's TokenizerManager that the admission gate's tests drive (test_admission.py in
pytest, admission_checks.py in a process of its own)."""


class RecordingManager:
    """Just what the gate touches on SGLang's TokenizerManager: rid_to_state and abort_request."""

    def __init__(self):
        self.rid_to_state = {}
        self.aborted = []

    def abort_request(self, rid):
        self.aborted.append(rid)
