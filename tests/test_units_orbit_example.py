"""`examples/units_orbit.py` runs: constants, `check_units` and the galactic
system in one program, against the plain program and literal orbital figures."""

import math
import runpy


def test_units_orbit_example(capsys):
    results = runpy.run_path("examples/units_orbit.py")["main"](steps=200)
    # sqrt(GM_sun / au) and 2 pi sqrt(au^3 / GM_sun), from IAU 2012/2015 values.
    gm, au = 1.3271244e20, 149597870700.0
    assert results["circular speed"] == f"{math.sqrt(gm / au) / 1e3:.3f} km / s"
    period_days = 2 * math.pi * math.sqrt(au**3 / gm) / 86400
    assert results["period"] == f"{period_days:.3f} d" == "365.257 d"
    # The unitful program is the plain one: the same numbers.
    assert results["max |unitful - plain|"] == "0.0e+00"
    assert results["time step in metres"] == (
        "check_units: argument `dt` of `make_orbit.<locals>.orbit` must have "
        "dimensions s"
    )
    assert "in galactic units: 0.030461 kpc / Myr" in capsys.readouterr().out
