"""The console script shortens OpenMP's spin-wait before torch loads, unless the user chose one."""

import subprocess
import sys

from batchtop.tui.__main__ import SPIN_COUNT, shorten_openmp_spin


def test_the_spin_is_shortened_unless_the_user_set_a_wait_policy_or_a_spin():
    env = {}
    shorten_openmp_spin(env)
    assert env == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for mine in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        env = dict(mine)
        shorten_openmp_spin(env)
        assert env == mine


def test_the_console_script_sets_it_before_torch_is_imported():
    code = ("import os, sys; sys.argv = ['batchtop', '--help']\n"
            "from batchtop.tui.__main__ import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split()[-2:] == [SPIN_COUNT, "False"]
