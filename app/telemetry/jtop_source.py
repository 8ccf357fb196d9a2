"""jtop source: the ONLY module that imports jetson-stats (`jtop`, AGPL-3.0), lazily, in open().

Optional extra `jetson`. jtop is a client of the jtop.service daemon; without the package, or with
the service stopped, open() raises SourceUnavailable saying which (jtop's own message names the fix).
What is read (jetson-stats jtop/jtop.py property docs, its units):
  jetson.temperature  {name: {"temp": °C (-256 when offline), "online": bool}}
  jetson.power        {"rail": {name: {"volt": mV, "curr": mA, "power": mW}}, "tot": {"power": mW}}
  jetson.gpu          {name: {"status": {"load": %}, "freq": {"cur": kHz, "max": kHz}}}
  jetson.cpu          {"cpu": [{"online": bool, "idle": %, "freq": {"cur": kHz, "max": kHz}}]}
  jetson.memory       {"RAM": {"used": kB, "tot": kB}}
  jetson.nvpmodel     NVPModel (str() is the mode name; .id) or None
"""

from __future__ import annotations

import time

from app.telemetry.sample import Sample, SourceUnavailable


class JtopSource:
    """Source "jtop" (jetson-stats)."""

    name = "jtop"

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self._j = None

    def open(self) -> None:
        try:
            import jtop as jtop_pkg
        except ImportError:
            raise SourceUnavailable("jetson-stats is not installed (pip install 'kvdeck[jetson]')") from None
        try:
            j = jtop_pkg.jtop(interval=self.interval)
            j.start()
        except Exception as e:  # jtop.JtopException: service not active, version mismatch, ...
            msg = " ".join(str(e).split())
            raise SourceUnavailable(f"the jtop service is not usable ({msg})") from None
        self._j = j

    def read(self) -> Sample:
        j = self._j
        if j is None:
            raise SourceUnavailable("jtop source read before open()")
        if not j.ok(spin=True):
            raise SourceUnavailable("lost the connection to the jtop service")
        t_mono, t_wall = time.monotonic(), time.time()
        notes: list[str] = []
        temps = {}
        for name, t in (j.temperature or {}).items():
            if not t.get("online", True) or t.get("temp", -256) <= -256:
                notes.append(f"zone {name}: offline")
            else:
                temps[name] = float(t["temp"])
        rails, power, scope = {}, None, ""
        pw = j.power or {}
        for name, r in (pw.get("rail") or {}).items():
            if "power" in r:
                rails[name] = r["power"] / 1000.0
        tot = pw.get("tot") or {}
        if "power" in tot:
            power = tot["power"] / 1000.0
            scope = tot.get("name") or "sum of rails"
        clocks, caps, load = {}, {}, {}
        for i, (name, g) in enumerate((j.gpu or {}).items()):
            key = "gpu" if i == 0 else f"gpu{i}"
            st, fr = g.get("status", {}), g.get("freq", {})
            if "load" in st:
                load[key] = float(st["load"])
            if fr.get("cur"):
                clocks[key] = fr["cur"] / 1000.0
            if fr.get("max"):
                caps[key] = fr["max"] / 1000.0
        cores = [c for c in (j.cpu or {}).get("cpu", []) if c.get("online")]
        if cores:
            cur = [c["freq"]["cur"] / 1000.0 for c in cores if c.get("freq", {}).get("cur")]
            mx = [c["freq"]["max"] / 1000.0 for c in cores if c.get("freq", {}).get("max")]
            if cur:
                clocks["cpu"] = round(sum(cur) / len(cur), 1)
            if mx:
                caps["cpu"] = max(mx)
            idle = [c["idle"] for c in cores if "idle" in c]
            if idle:
                load["cpu"] = round(100.0 - sum(idle) / len(idle), 1)
        mem = {}
        ram = (j.memory or {}).get("RAM") if hasattr(j, "memory") else None
        if ram and ram.get("tot"):
            mem = {"ram_used": round(ram["used"] / 1024, 1), "ram_total": round(ram["tot"] / 1024, 1)}
        mode = ""
        if j.nvpmodel is not None:
            mid = getattr(j.nvpmodel, "id", None)
            mode = f"{j.nvpmodel} (id {mid})" if mid is not None else str(j.nvpmodel)
        return Sample(t_mono=t_mono, t_wall=t_wall, source=self.name, temps_c=temps, rails_w=rails,
                      power_w=power, power_scope=scope, clocks_mhz=clocks, caps_mhz=caps, load_pct=load,
                      mem_mb=mem, power_mode=mode, notes=tuple(notes))

    def close(self) -> None:
        if self._j is not None:
            try:
                self._j.close()
            except Exception:
                pass
        self._j = None
