"""What goes into a task image (no engine needed): R2E-Gym's layout, ownership, and the content-hash tag."""

import io
import shutil
import tarfile

from trainer.environments.swe.image import AGENT_UID, RUN_TESTS_SH, _split_name, base_tag, task_archive, task_image_tag
from trainer.environments.swe.tasks import SWETasks

TASK = SWETasks().all[0]


def members(task):
    with tarfile.open(fileobj=io.BytesIO(task_archive(task))) as tar:
        return {
            m.name: (m.uid, m.mode, m.isdir(), tar.extractfile(m).read() if m.isfile() else None)
            for m in tar.getmembers()
        }


def test_archive_layout_and_ownership():
    entries = members(TASK)
    assert entries["testbed"][:3] == (AGENT_UID, 0o755, True)
    assert entries["testbed/roman.py"][:3] == (AGENT_UID, 0o644, False)  # the agent may edit the repository
    assert entries["testbed/run_tests.sh"][:2] == (0, 0o644)
    assert entries["testbed/run_tests.sh"][3] == RUN_TESTS_SH.encode()
    assert entries["r2e_tests"][:3] == (0, 0o700, True)  # hidden tests: root only, moved to /root at start
    assert entries["r2e_tests/test_roman.py"][0] == 0
    assert not [name for name in entries if name.startswith("testbed/") and "test_roman.py" in name]
    assert not any(b'(4, "IV")' in (data or b"") for *_, data in entries.values())  # no gold patch inside
    assert "cd /testbed/r2e_tests && " in RUN_TESTS_SH and "--noconftest" in RUN_TESTS_SH


def test_content_hash_tag_follows_the_files(tmp_path):
    base = base_tag()
    tag = task_image_tag(TASK, base)
    assert tag.startswith("swe-harness/roman:") and tag == task_image_tag(TASK, base)  # deterministic
    assert task_image_tag(TASK, "swe-harness-base:other") != tag  # a new base means a new image
    repo = tmp_path / "repo"
    shutil.copytree(TASK.repo_path, repo)
    copy = type(TASK)(**{**TASK.__dict__, "repo_path": repo})
    assert task_image_tag(copy, base) == tag  # same bytes, same tag, wherever they live
    (repo / "roman.py").write_text((repo / "roman.py").read_text() + "\n# changed\n")
    assert task_image_tag(copy, base) != tag


def test_split_name():
    assert _split_name("swe-harness/roman:latest") == ("swe-harness/roman", "latest")
    assert _split_name("localhost:5000/x") == ("localhost:5000/x", "latest")
    assert _split_name("plain") == ("plain", "latest")
