"""SGLang-compatible bootstrap HTTP server (hosted by the prefill side, aiohttp in a thread).

Routes, bodies and statuses follow SGLang 0.5.23 `srt/disaggregation/common/conn.py`
(CommonKVBootstrapServer), so SGLang's decode side and ours can use either server:

PUT  /route   JSON body registering one prefill rank. Required keys: attn_tp_size, attn_tp_rank,
              attn_cp_size, attn_cp_rank, attn_dp_size, attn_dp_rank, pp_size, pp_rank,
              system_dp_size, system_dp_rank, rank_ip, rank_port, page_size, kv_cache_dtype.
              Optional: kv_layout, prefill_http_port, dsv41_spec_layout, decode_allocation_policy
              ("early"), load_balance_method ("follow_bootstrap_room"), enable_dsa_cache_layer_split,
              enable_kv_cache_sharding. The first registration fixes the topology (dp_size is
              attn_dp_size when system_dp_size == 1, else system_dp_size; ditto the dp group).
              200 "OK"; 400 "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks" or
              "Inconsistent prefill allocation policies" when a later rank disagrees;
              500 on a missing key or a body that is not JSON (SGLang raises there too).
GET  /route?prefill_dp_rank=&prefill_cp_rank=&target_tp_rank=&target_pp_rank=
              400 "Missing inputs for bootstrap server." if any is missing or empty;
              503 "Prefill server not fully registered yet (K workers registered)." until
              dp*cp*tp*pp registrations arrived; all four == -1: 200 with the server info
              {attn_tp_size, attn_cp_size, dp_size, pp_size, page_size, kv_cache_dtype,
               follow_bootstrap_room, enable_dsa_cache_layer_split, [dsv41_spec_layout],
               [kv_layout], decode_allocation_policy, enable_kv_cache_sharding, prefill_http_port,
               target_tp_rank, target_tp_ranks, target_cp_ranks, target_pp_ranks,
               required_dst_info_num, required_prefill_response_num}
              (bracketed keys only when set; the target_* / required_* keys are always null);
              otherwise 200 {"rank_ip", "rank_port"} or 404 "Bootstrap info not found for ...".
              Other methods on /route: 405 "Method not allowed".
GET  /health  200 "OK".
POST /register_dp_rank  {"bootstrap_room", "dp_rank"} -> 200 "OK" (entries expire after the
              cleanup interval, 120 s by default).
POST /query_dp_ranks    {"bootstrap_rooms": [...]} -> 200 {"<room>": dp_rank, ...} for known rooms.
"""

from __future__ import annotations

import asyncio
import threading
import time

from aiohttp import web

READY_TIMEOUT_S = 10.0


class BootstrapServer:
    def __init__(self, host: str, port: int, entry_cleanup_interval_s: float = 120.0):
        self.host = host
        self.port = port  # 0 picks a free port; the bound one is stored here once listening
        self.entry_cleanup_interval_s = entry_cleanup_interval_s
        self._lock = asyncio.Lock()
        self._topology: dict = {}
        self._registered = 0
        self._rank_table: dict[int, dict[int, dict[int, dict[int, dict]]]] = {}
        self._room_dp_rank: dict[int, tuple[int, float]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"bootstrap-{port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(READY_TIMEOUT_S) or self._error is not None:
            raise RuntimeError(f"bootstrap server on {host}:{port} did not start: {self._error}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # ---- lifecycle -------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/route", self._route)
        app.router.add_post("/register_dp_rank", self._register_dp_rank)
        app.router.add_post("/query_dp_ranks", self._query_dp_ranks)
        app.router.add_get("/health", self._health)
        return app

    def _serve(self) -> None:
        self._loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self._app(), access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host=self.host, port=self.port)
            loop.run_until_complete(site.start())
            self.port = runner.addresses[0][1]
            cleanup = loop.create_task(self._expire_dp_ranks())
            self._ready.set()
            loop.run_forever()
            cleanup.cancel()
        except BaseException as exc:  # reported to the constructor
            self._error = exc
            self._ready.set()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def close(self, timeout_s: float = 5.0) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)

    # ---- handlers --------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", status=200)

    async def _route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            return await self._register_rank(request)
        if request.method == "GET":
            return await self._query_route(request)
        return web.Response(text="Method not allowed", status=405, content_type="application/json")

    def _is_ready(self) -> bool:
        t = self._topology
        if not t:
            return False
        return self._registered >= t["dp_size"] * t["attn_cp_size"] * t["attn_tp_size"] * t["pp_size"]

    async def _register_rank(self, request: web.Request) -> web.Response:
        data = await request.json()
        try:
            fields = {k: data[k] for k in ("attn_tp_size", "attn_tp_rank", "attn_cp_size", "attn_cp_rank",
                                           "attn_dp_size", "attn_dp_rank", "pp_size", "pp_rank",
                                           "system_dp_size", "system_dp_rank", "rank_ip", "rank_port",
                                           "page_size", "kv_cache_dtype")}
        except KeyError as exc:
            return web.Response(text=f"Missing field {exc.args[0]!r} in prefill registration", status=500)
        spec_layout = data.get("dsv41_spec_layout")
        policy = data.get("decode_allocation_policy", "early")
        t = self._topology
        if self._registered and t["dsv41_spec_layout"] != spec_layout:
            return web.Response(text="DeepSeek-V4.1 DSpark PD layout differs across prefill ranks", status=400)
        if self._registered and t["decode_allocation_policy"] != policy:
            return web.Response(text="Inconsistent prefill allocation policies", status=400)
        single_system_dp = fields["system_dp_size"] == 1
        if not t:  # the first registration fixes the topology
            t.update(
                attn_tp_size=fields["attn_tp_size"], attn_cp_size=fields["attn_cp_size"],
                dp_size=fields["attn_dp_size"] if single_system_dp else fields["system_dp_size"],
                pp_size=fields["pp_size"], page_size=int(fields["page_size"]),
                kv_cache_dtype=fields["kv_cache_dtype"], kv_layout=data.get("kv_layout"),
                prefill_http_port=(None if data.get("prefill_http_port") is None
                                   else int(data["prefill_http_port"])),
                follow_bootstrap_room=data.get("load_balance_method", "follow_bootstrap_room")
                == "follow_bootstrap_room",
                enable_dsa_cache_layer_split=bool(data.get("enable_dsa_cache_layer_split", False)),
                enable_kv_cache_sharding=bool(data.get("enable_kv_cache_sharding", False)))
        else:  # like SGLang, fields still unset may be filled in by a later rank
            late = {"page_size": fields["page_size"], "kv_cache_dtype": fields["kv_cache_dtype"],
                    "kv_layout": data.get("kv_layout"), "prefill_http_port": data.get("prefill_http_port")}
            for key, value in late.items():
                if t[key] is None and value is not None:
                    t[key] = str(value) if key in ("kv_cache_dtype", "kv_layout") else int(value)
        t["dsv41_spec_layout"], t["decode_allocation_policy"] = spec_layout, policy
        dp_group = fields["attn_dp_rank"] if single_system_dp else fields["system_dp_rank"]
        async with self._lock:
            (self._rank_table.setdefault(dp_group, {}).setdefault(fields["attn_cp_rank"], {})
             .setdefault(fields["attn_tp_rank"], {}))[fields["pp_rank"]] = {
                "rank_ip": str(fields["rank_ip"]), "rank_port": int(fields["rank_port"])}
            self._registered += 1
        return web.Response(text="OK", status=200)

    def _server_info(self) -> dict:
        t = self._topology
        info = {
            "attn_tp_size": int(t["attn_tp_size"]), "attn_cp_size": int(t["attn_cp_size"]),
            "dp_size": int(t["dp_size"]), "pp_size": int(t["pp_size"]),
            "page_size": t["page_size"],
            "kv_cache_dtype": None if t["kv_cache_dtype"] is None else str(t["kv_cache_dtype"]),
            "follow_bootstrap_room": bool(t["follow_bootstrap_room"]),
            "enable_dsa_cache_layer_split": t["enable_dsa_cache_layer_split"],
            "dsv41_spec_layout": t["dsv41_spec_layout"], "kv_layout": t["kv_layout"],
            "decode_allocation_policy": t["decode_allocation_policy"],
            "enable_kv_cache_sharding": t["enable_kv_cache_sharding"],
            "prefill_http_port": t["prefill_http_port"],
            "target_tp_rank": None, "target_tp_ranks": None, "target_cp_ranks": None,
            "target_pp_ranks": None, "required_dst_info_num": None, "required_prefill_response_num": None,
        }
        for optional in ("dsv41_spec_layout", "kv_layout"):
            if info[optional] is None:
                del info[optional]
        return info

    async def _query_route(self, request: web.Request) -> web.Response:
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        values = [request.query.get(k) for k in keys]
        if not all(values):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        dp, cp, tp, pp = (int(v) for v in values)
        if not self._is_ready():
            return web.Response(text=f"Prefill server not fully registered yet"
                                     f" ({self._registered} workers registered).", status=503)
        if (dp, cp, tp, pp) == (-1, -1, -1, -1):
            return web.json_response(self._server_info(), status=200)
        async with self._lock:
            rank = self._rank_table.get(dp, {}).get(cp, {}).get(tp, {}).get(pp)
        if rank is None:
            return web.Response(text=f"Bootstrap info not found for dp_rank={values[0]} cp_rank={values[1]} "
                                     f"tp_rank={values[2]} pp_rank={values[3]}", status=404)
        return web.json_response(rank, status=200)

    async def _register_dp_rank(self, request: web.Request) -> web.Response:
        data = await request.json()
        room, dp_rank = int(data["bootstrap_room"]), int(data["dp_rank"])
        async with self._lock:
            self._room_dp_rank[room] = (dp_rank, time.time())
        return web.Response(text="OK", status=200)

    async def _query_dp_ranks(self, request: web.Request) -> web.Response:
        data = await request.json()
        async with self._lock:
            found = {str(int(r)): self._room_dp_rank[int(r)][0]
                     for r in data["bootstrap_rooms"] if int(r) in self._room_dp_rank}
        return web.json_response(found, status=200)

    async def _expire_dp_ranks(self) -> None:
        while True:
            await asyncio.sleep(self.entry_cleanup_interval_s)
            cutoff = time.time() - self.entry_cleanup_interval_s
            async with self._lock:
                for room in [r for r, (_, ts) in self._room_dp_rank.items() if ts < cutoff]:
                    del self._room_dp_rank[room]
