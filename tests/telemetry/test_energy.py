"""Per-call summaries against hand computations; the history ring and its downsampling."""

from __future__ import annotations

import pytest

from app.telemetry.energy import summarize_call
from app.telemetry.history import History
from app.telemetry.sample import Sample


def smp(t, p=None, temp=None, **kw):
    return Sample(t_mono=float(t), t_wall=1000.0 + t, source="test", power_w=p, power_scope="VDD_IN" if p else "",
                  temps_c={} if temp is None else {"tj": temp}, **kw)


def test_energy_trapezoid_with_interpolated_edges_matches_hand_computation():
    trace = [smp(0, 10, 40), smp(1, 20, 50), smp(2, 10, 50), smp(3, 30, 60)]
    c = summarize_call(trace, 0.5, 2.5, tokens=125)
    # P(0.5)=15, P(1)=20, P(2)=10, P(2.5)=20:  0.5*(15+20)/2 + 1*(20+10)/2 + 0.5*(10+20)/2 = 31.25 J
    assert c.energy_j == 31.25
    assert c.mean_power_w == 15.625 and c.peak_power_w == 20.0
    assert c.tokens_per_j == 4.0 and c.samples == 2 and c.held_s == 0.0
    # tj: 45 at 0.5, 50, 50, 55 at 2.5 -> time-weighted mean (23.75 + 50 + 26.25) / 2 = 50
    assert c.temps_c == {"tj": {"min": 45.0, "max": 55.0, "mean": 50.0}}
    assert c.power_scope == "VDD_IN" and not c.throttled
    d = c.as_dict()
    assert d["energy_j"] == 31.25 and d["throttle_reasons"] == []


def test_call_shorter_than_the_sampling_interval_is_interpolated():
    c = summarize_call([smp(0, 10), smp(1, 20)], 0.2, 0.4, tokens=26)
    assert c.samples == 0 and c.energy_j == pytest.approx(0.2 * (12 + 14) / 2)  # 2.6 J
    assert c.tokens_per_j == pytest.approx(10.0)


def test_edge_without_a_sample_beyond_it_is_held_and_reported():
    c = summarize_call([smp(1, 10), smp(2, 20)], 0.5, 2.0, tokens=0)
    assert c.energy_j == pytest.approx(0.5 * 10 + 1.0 * 15)  # 20 J: 10 W held over [0.5, 1]
    assert c.held_s == 0.5 and c.tokens_per_j == 0.0


def test_no_power_sensor_means_no_energy_but_temperatures_still_summarised():
    c = summarize_call([smp(0, temp=30), smp(1, temp=32)], 0.0, 1.0, tokens=10)
    assert c.energy_j is None and c.mean_power_w is None and c.tokens_per_j is None
    assert c.temps_c["tj"] == {"min": 30.0, "max": 32.0, "mean": 31.0}


def test_throttle_marks():
    base = dict(clocks_mhz={"gpu": 1300.0}, caps_mhz={"gpu": 1300.5}, load_pct={"gpu": 90.0})
    calm = [smp(0, 5, throttle={"oc3_event_cnt": 4, "trip:cpu": False}, **base),
            smp(1, 5, throttle={"oc3_event_cnt": 4, "trip:cpu": False}, **base)]
    assert not summarize_call(calm, 0, 1, 1).throttled
    oc = calm[:1] + [smp(1, 5, throttle={"oc3_event_cnt": 6, "trip:cpu": False}, **base)]
    assert summarize_call(oc, 0, 1, 1).throttle_reasons == ("oc3_event_cnt +2",)
    trip = calm[:1] + [smp(1, 5, throttle={"oc3_event_cnt": 4, "trip:cpu": True}, **base)]
    assert summarize_call(trip, 0, 1, 1).throttle_reasons == ("trip:cpu rose",)
    cap = calm[:1] + [smp(1, 5, clocks_mhz={"gpu": 1300.0}, caps_mhz={"gpu": 918.0}, load_pct={"gpu": 90.0})]
    assert summarize_call(cap, 0, 1, 1).throttle_reasons == ("gpu clock cap 1300.5 -> 918 MHz",)
    busy_slow = calm[:1] + [smp(1, 5, clocks_mhz={"gpu": 600.0}, caps_mhz={"gpu": 1300.5}, load_pct={"gpu": 95.0})]
    assert summarize_call(busy_slow, 0, 1, 1).throttle_reasons == ("gpu clock 1300 -> 600 MHz at 95% load",)
    idle_slow = calm[:1] + [smp(1, 5, clocks_mhz={"gpu": 600.0}, caps_mhz={"gpu": 1300.5}, load_pct={"gpu": 3.0})]
    assert not summarize_call(idle_slow, 0, 1, 1).throttled  # DVFS idling down is not throttling


def test_bad_window_and_empty_history():
    with pytest.raises(ValueError, match="t1 .* is before t0"):
        summarize_call([], 2.0, 1.0, 0)
    c = summarize_call(History(), 0.0, 1.0, 5)
    assert c.samples == 0 and c.energy_j is None and c.tokens == 5


def test_history_bounded_with_downsampled_tier_used_for_old_windows():
    h = History(raw_len=10, tiers=((5.0, 4),))
    for t in range(30):
        h.append(smp(t, p=float(t)))
    raw = h.raw()
    assert len(raw) == 10 and raw[0].t_mono == 20.0  # bounded: the oldest raw samples are gone
    # A window older than the raw ring comes from the 5 s tier (means of 5 samples each, 4 kept).
    w = h.window(8.0, 22.0)
    old = [s for s in w if s.t_mono < 20.0]
    assert [s.t_mono for s in old] == [7.0, 12.0, 17.0]  # the oldest kept bucket (0..4) fell out
    assert [s.power_w for s in old] == [7.0, 12.0, 17.0]
    assert [s.t_mono for s in w if s.t_mono >= 20.0] == [20.0, 21.0, 22.0, 23.0]  # one beyond t1
    assert len(h.series(8.0)) == 9 and h.series(25.0)[0].t_mono == 7.0
    h.append(smp(5, p=1.0))  # out of time order (a trace restarting): ignored
    assert h.latest().t_mono == 29.0


def test_recorded_h200_trace_energy_matches_numpy_and_shows_the_load():
    """The committed NVML trace (assets/telemetry): each call's energy equals numpy's trapezoid over
    the same piecewise-linear power curve, and generating draws clearly more than idling."""
    import json
    from pathlib import Path

    import numpy as np

    from app.telemetry import load_trace

    assets = Path(__file__).resolve().parents[2] / "assets" / "telemetry"
    trace = load_trace(assets / "h200_nvml_generate.jsonl")
    calls = json.loads((assets / "h200_nvml_generate.calls.json").read_text())
    ts = np.array([s.t_mono for s in trace])
    ps = np.array([s.power_w for s in trace])
    idle = float(np.median(ps[ts < calls[0]["t0"] - 3.0]))
    for c in calls:
        got = summarize_call(trace, c["t0"], c["t1"], c["tokens"])
        grid = np.concatenate([[c["t0"]], ts[(ts > c["t0"]) & (ts < c["t1"])], [c["t1"]]])
        want = float(np.trapezoid(np.interp(grid, ts, ps), grid))
        assert got.energy_j == pytest.approx(want, rel=1e-6)
        assert got.tokens_per_j == pytest.approx(c["tokens"] / want, rel=1e-3)
        assert got.mean_power_w > idle + 40.0 and got.held_s == 0.0 and not got.throttled
