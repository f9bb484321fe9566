"""Issue 48 item 5: nothing that carries code is read from a folder others can write.

`emo run` hands its Snakemake the planned sweep as a pickle in the results folder; whoever can write
that folder can replace the file. Only a file this user alone wrote (owned by it, mode 0600, not a
link) is unpickled; anything else is ignored and the sweep is composed afresh.
"""

from __future__ import annotations

import os
import pickle

from emo.workflow import sweep


class _Payload:
    """A pickle that runs code when loaded: it touches `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _planted(path, marker, mode: int, uid: int | None = None):
    path.write_bytes(pickle.dumps(_Payload(marker)))
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def test_a_pickle_someone_else_could_have_written_is_never_loaded(tmp_path):
    marker = tmp_path / "pwned"
    for i, (mode, uid) in enumerate([(0o644, None), (0o666, None), (0o600, 65534)]):
        if uid is not None and os.geteuid() != 0:
            continue  # planting another user's file needs root
        planted = _planted(tmp_path / f"plan{i}.pickle", marker, mode, uid)
        assert sweep._load_planned(str(planted)) is None
        assert not marker.exists(), f"mode {mode:o}, uid {uid}: the payload ran"
    link = tmp_path / "link.pickle"
    link.symlink_to(_planted(tmp_path / "own.pickle", marker, 0o600))
    assert sweep._load_planned(str(link)) is None and not marker.exists()


def test_the_planned_sweep_is_written_private_and_read_back(tmp_path):
    jobs = sweep.expand([f"results={tmp_path}", "budget=0.02,0.05"], True)
    sw = sweep.build(jobs)
    path = tmp_path / "plan.pickle"
    path.write_bytes(b"")
    os.chmod(path, 0o666)  # a name that existed with a wide mode is made private
    sweep.save_planned(sw, path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert sweep._load_planned(str(path)) == sw
