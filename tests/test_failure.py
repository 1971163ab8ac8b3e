"""One host's error in one line (locojax/failure.py): the host, the exception, and the
innermost frame of the user's own code, found through the exception it was raised from."""

import pytest

from locojax import failure
from locojax.envs.user import load_ref


def test_the_line_names_the_users_file_and_line_through_a_wrapping_error(tmp_path,
                                                                          monkeypatch):
    (tmp_path / "bad_mod.py").write_text("x = 1\nraise RuntimeError('no table here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as info:  # load_ref wraps the module's own error
        load_ref(f"{tmp_path / 'bad_mod.py'}:f")
    line = failure.describe(info.value, 1, 4)
    assert line.startswith("host 1 of 4: ValueError: ") and "no table here" in line
    assert line.endswith(f"(at {tmp_path / 'bad_mod.py'}:2)")
    assert failure.describe(info.value, 0, 1).startswith("ValueError: ")  # one host: no host


def test_an_error_without_user_frames_names_none():
    error = ValueError("bad flag")  # never raised: no frames at all
    assert failure.user_frame(error) == ""
    assert failure.describe(error, 0, 1) == "ValueError: bad flag"


def test_one_host_returns_the_code_and_says_the_line_last(capsys):
    assert failure.stop("train", KeyError("k"), 3, 0, 1, show_traceback=False) == 3
    assert capsys.readouterr().err == "locojax train: KeyError: 'k'\n"
