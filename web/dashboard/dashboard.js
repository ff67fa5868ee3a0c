// The live dashboard of `metronome serve`: polls /v1/stats (JSON) and /metrics (Prometheus text)
// once a second, keeps the last five minutes in memory and draws them with uPlot. Everything runs
// in the page; the server only serves these files. Works without uPlot too (numbers and the
// session table still update), for builds made before scripts/setup.sh installed it.
//
// The state is exposed as window.metronomeDashboard for tests and for poking at in the console.
(() => {
  'use strict';

  const POLL_MS = 1000;
  const WINDOW_S = 300;
  const FETCH_TIMEOUT_MS = 2500;
  // Without a poll for this long the connection is shown as stale.
  const STALE_MS = 3500;
  // With a finite forecast the KV chart runs past "now" to draw the projection: to the moment the
  // pool is full (plus a margin), within these bounds.
  const FORECAST_HORIZON_MIN_S = 10;
  const FORECAST_HORIZON_MAX_S = 60;
  const LATENCY_HISTOGRAM = 'metronome_frame_latency_ms_bucket';
  const CHART_HEIGHT = 220;
  // The mute-alarm banner stays this long after the last new alarm (or until dismissed).
  const ALARM_HOLD_MS = 30_000;

  const COLORS = {
    p50: '#93c5fd',
    p90: '#3b82f6',
    p99: '#1e3a8a',
    deadline: '#dc2626',
    kv: '#2563eb',
    forecast: '#dc2626',
    limit: '#64748b',
    active: '#0ea5e9',
    ok: '#16a34a',
    late: '#d97706',
    starved: '#dc2626',
    short: '#9333ea',
    mute: '#111827',
    axis: '#6b7585',
    grid: '#eef1f5',
  };

  const series = {
    t: [],           // poll time, unix seconds (the page's clock)
    p50: [],         // ms, from the latency histogram's increase since the previous poll
    p90: [],
    p99: [],
    deadline: [],    // ms, the tightest live session's deadline (last known when none are live)
    kvPct: [],       // % of KV blocks in use
    limit: [],       // admission limit (null: none)
    active: [],      // active sessions
    ok: [],          // frames/s by outcome over the poll interval
    late: [],
    starved: [],
    short: [],
    muteAlarms: [],  // cumulative
  };

  const state = {
    polls: 0,          // successful polls
    errors: 0,         // failed polls
    lastError: null,
    lastStats: null,
    lastPollAt: 0,     // Date.now() of the last successful poll
    deadlineMs: null,
    forecast: null,    // {t0, pct0, tSat} while the pool is forecast to fill
    alarmUntil: 0,
    chartsEnabled: typeof window.uPlot === 'function',
    series,
    get lengths() {
      const out = {};
      for (const [k, v] of Object.entries(series)) out[k] = v.length;
      return out;
    },
  };
  window.metronomeDashboard = state;

  let prevStats = null;
  let prevBuckets = null;
  const charts = {};

  // ---- access token -------------------------------------------------------------------------

  // The token comes in the URL fragment (/#token=T), which the browser never sends to a server:
  // it stays out of access logs and referrers.
  function readToken() {
    return new URLSearchParams(location.hash.replace(/^#/, '')).get('token') || '';
  }
  let token = readToken();
  window.addEventListener('hashchange', () => { token = readToken(); });

  async function get(path, auth) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), FETCH_TIMEOUT_MS);
    try {
      const headers = auth && token ? {Authorization: `Bearer ${token}`} : {};
      const res = await fetch(path, {headers, cache: 'no-store', signal: controller.signal});
      if (!res.ok) {
        const err = new Error(`${path}: HTTP ${res.status}`);
        err.status = res.status;
        throw err;
      }
      return res;
    } finally {
      clearTimeout(timer);
    }
  }

  // ---- Prometheus text ----------------------------------------------------------------------

  function parseValue(s) {
    if (s === '+Inf') return Infinity;
    if (s === '-Inf') return -Infinity;
    return Number(s);
  }

  // The cumulative buckets of one histogram: [{le, count}] by increasing le (+Inf last).
  function histogramBuckets(text, name) {
    const out = [];
    for (const line of text.split('\n')) {
      if (!line.startsWith(name)) continue;
      const m = /^(\S+?)\{([^}]*)\}\s+(\S+)/.exec(line);
      if (!m || m[1] !== name) continue;
      const le = /(?:^|,)le="([^"]*)"/.exec(m[2]);
      if (!le) continue;
      out.push({le: parseValue(le[1]), count: parseValue(m[3])});
    }
    out.sort((a, b) => a.le - b.le);
    return out;
  }

  // The q-quantile of the observations added between two snapshots of a cumulative histogram,
  // interpolated linearly inside its bucket (as Prometheus' histogram_quantile does). null when
  // nothing was observed or the counters went back (a restarted server).
  function quantileOfIncrease(prev, cur, q) {
    if (!prev || prev.length !== cur.length || cur.length === 0) return null;
    const inc = cur.map((b, i) => ({le: b.le, c: b.count - prev[i].count}));
    if (inc.some((b, i) => b.c < 0 || b.le !== prev[i].le)) return null;
    const total = inc[inc.length - 1].c;
    if (!(total > 0)) return null;
    const rank = q * total;
    let lower = 0;
    let below = 0;
    for (const b of inc) {
      if (b.c >= rank) {
        // In the +Inf bucket all we know is "above the last bound".
        if (!Number.isFinite(b.le)) return lower;
        const inBucket = b.c - below;
        return inBucket > 0 ? lower + (b.le - lower) * (rank - below) / inBucket : b.le;
      }
      lower = b.le;
      below = b.c;
    }
    return lower;
  }

  // ---- formatting ---------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);
  const num = (v) => (v == null ? '–' : Number(v).toLocaleString('en-US'));
  function ms(v) {
    if (v == null || !Number.isFinite(v)) return '–';
    return v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0);
  }
  function duration(s) {
    if (s == null || !Number.isFinite(s)) return '–';
    if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} m ${String(Math.floor(s % 60)).padStart(2, '0')} s`;
    return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, '0')} m`;
  }
  function setTile(id, value, sub, level) {
    $(`v-${id}`).innerHTML = value;
    $(`s-${id}`).textContent = sub;
    const tile = $(`tile-${id}`);
    tile.classList.remove('good', 'warn', 'bad');
    if (level) tile.classList.add(level);
  }
  const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

  // ---- charts -------------------------------------------------------------------------------

  const fmt = (f) => (u, v) => (v == null || !Number.isFinite(v) ? '–' : f(v));
  const asMs = fmt((v) => `${ms(v)} ms`);
  const asRate = fmt((v) => `${v.toFixed(1)}/s`);
  const asCount = fmt((v) => num(Math.round(v)));
  const asPct = fmt((v) => `${v.toFixed(1)} %`);
  const timeSeries = {value: '{HH}:{mm}:{ss}'};

  function line(label, color, extra = {}) {
    return {label, stroke: color, width: 1.75, points: {show: false}, spanGaps: false, ...extra};
  }
  function yAxis(label, extra = {}) {
    return {
      label,
      labelSize: 18,
      labelFont: '12px system-ui, sans-serif',
      font: '11px system-ui, sans-serif',
      stroke: COLORS.axis,
      grid: {stroke: COLORS.grid, width: 1},
      ticks: {stroke: COLORS.grid, width: 1},
      size: 50,
      ...extra,
    };
  }
  const xAxis = {
    font: '11px system-ui, sans-serif',
    stroke: COLORS.axis,
    grid: {stroke: COLORS.grid, width: 1},
    ticks: {stroke: COLORS.grid, width: 1},
  };

  function makeChart(id, opts, data) {
    const el = $(id);
    const u = new window.uPlot({
      width: Math.max(200, el.clientWidth),
      height: CHART_HEIGHT,
      cursor: {drag: {x: false, y: false}, points: {size: 6}},
      legend: {live: true},
      ...opts,
    }, data, el);
    new ResizeObserver(() => {
      u.setSize({width: Math.max(200, el.clientWidth), height: CHART_HEIGHT});
    }).observe(el);
    return u;
  }

  function forecastHorizon() {
    const f = state.forecast;
    if (!f) return 0;
    return Math.min(FORECAST_HORIZON_MAX_S, Math.max(FORECAST_HORIZON_MIN_S, 1.25 * f.tSat));
  }

  // The forecast rho(t) = rho0 + N r t is a straight line: from the last sample to 100% at t_sat.
  function drawForecast(u) {
    const f = state.forecast;
    if (!f) return;
    const {ctx, bbox} = u;
    const x0 = u.valToPos(f.t0, 'x', true);
    const y0 = u.valToPos(f.pct0, 'y', true);
    const x1 = u.valToPos(f.t0 + f.tSat, 'x', true);
    const y1 = u.valToPos(100, 'y', true);
    const dpr = window.devicePixelRatio || 1;
    ctx.save();
    ctx.beginPath();
    ctx.rect(bbox.left, bbox.top, bbox.width, bbox.height);
    ctx.clip();
    ctx.strokeStyle = COLORS.forecast;
    ctx.lineWidth = 1.5 * dpr;
    ctx.setLineDash([6 * dpr, 4 * dpr]);
    ctx.beginPath();
    ctx.moveTo(x0, y0);
    ctx.lineTo(x1, y1);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = COLORS.forecast;
    ctx.font = `${11 * dpr}px system-ui, sans-serif`;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'top';
    ctx.fillText(`projected full in ${duration(f.tSat)}`, bbox.left + bbox.width - 6 * dpr,
                 bbox.top + 6 * dpr);
    ctx.restore();
  }

  function initCharts() {
    const empty = (n) => [[], ...Array.from({length: n}, () => [])];
    charts.latency = makeChart('chart-latency', {
      scales: {x: {time: true}, y: {range: (u, min, max) => [0, Math.max(1, max) * 1.1]}},
      series: [timeSeries, line('p50', COLORS.p50, {value: asMs}),
        line('p90', COLORS.p90, {value: asMs}), line('p99', COLORS.p99, {width: 2, value: asMs}),
        line('deadline', COLORS.deadline, {dash: [6, 4], width: 1.5, value: asMs})],
      axes: [xAxis, yAxis('ms')],
    }, empty(4));
    charts.kv = makeChart('chart-kv', {
      scales: {
        x: {time: true, range: (u, min, max) => [min, max + forecastHorizon()]},
        y: {range: [0, 100]},
      },
      series: [timeSeries,
        line('used', COLORS.kv, {fill: 'rgba(37, 99, 235, 0.10)', width: 2, value: asPct})],
      axes: [xAxis, yAxis('% used')],
      hooks: {draw: [drawForecast]},
    }, empty(1));
    charts.admission = makeChart('chart-admission', {
      scales: {x: {time: true}, y: {range: (u, min, max) => [0, Math.max(4, max) * 1.15]}},
      series: [timeSeries,
        line('limit', COLORS.limit,
             {width: 2, paths: window.uPlot.paths.stepped({align: 1}), value: asCount}),
        line('active', COLORS.active,
             {fill: 'rgba(14, 165, 233, 0.10)', width: 2, value: asCount})],
      axes: [xAxis, yAxis('sessions')],
    }, empty(2));
    charts.frames = makeChart('chart-frames', {
      scales: {
        x: {time: true},
        y: {range: (u, min, max) => [0, Math.max(1, max) * 1.1]},
        alarms: {range: (u, min, max) => [0, Math.max(5, max) * 1.1]},
      },
      series: [timeSeries, line('ok', COLORS.ok, {fill: 'rgba(22, 163, 74, 0.08)', value: asRate}),
        line('late', COLORS.late, {value: asRate}),
        line('starved', COLORS.starved, {value: asRate}),
        line('short', COLORS.short, {value: asRate}),
        line('mute alarms', COLORS.mute, {scale: 'alarms', dash: [2, 3], value: asCount,
          paths: window.uPlot.paths.stepped({align: 1})})],
      axes: [xAxis, yAxis('frames/s'),
        yAxis('alarms', {scale: 'alarms', side: 1, grid: {show: false}, size: 44})],
    }, empty(5));
  }

  function redrawCharts() {
    const s = series;
    charts.latency.setData([s.t, s.p50, s.p90, s.p99, s.deadline]);
    charts.kv.setData([s.t, s.kvPct]);
    charts.admission.setData([s.t, s.limit, s.active]);
    charts.frames.setData([s.t, s.ok, s.late, s.starved, s.short, s.muteAlarms]);
    // Unless the pointer is on a chart, its legend shows the latest values rather than dashes.
    for (const u of Object.values(charts)) {
      if (u.cursor.left == null || u.cursor.left < 0) u.setLegend({idx: s.t.length - 1});
    }
  }

  // ---- one poll -----------------------------------------------------------------------------

  function record(stats, buckets, now) {
    const t = now / 1000;
    const prev = prevStats;
    const dt = prev ? stats.t_s - prev.t_s : 0;
    const rate = (key) => (prev && dt > 0 ? Math.max(0, stats.frames[key] - prev.frames[key]) / dt : null);

    if (stats.deadline_ms != null) state.deadlineMs = stats.deadline_ms;
    const kv = stats.kv;
    const pct = kv.total_blocks > 0 ? (100 * kv.used_blocks) / kv.total_blocks : null;
    const tSat = stats.forecast ? stats.forecast.t_sat_s : null;
    // A full pool has nothing left to project.
    state.forecast = tSat != null && tSat > 0 && pct != null && pct < 100 ? {t0: t, pct0: pct, tSat} : null;

    series.t.push(t);
    series.p50.push(quantileOfIncrease(prevBuckets, buckets, 0.5));
    series.p90.push(quantileOfIncrease(prevBuckets, buckets, 0.9));
    series.p99.push(quantileOfIncrease(prevBuckets, buckets, 0.99));
    series.deadline.push(state.deadlineMs);
    series.kvPct.push(pct);
    series.limit.push(stats.admission.limit);
    series.active.push(stats.sessions.active);
    series.ok.push(rate('ok'));
    series.late.push(rate('late'));
    series.starved.push(rate('starved'));
    series.short.push(rate('short'));
    series.muteAlarms.push(stats.frames.mute_alarms);

    let drop = 0;
    while (drop < series.t.length && series.t[drop] < t - WINDOW_S) ++drop;
    if (drop > 0) for (const v of Object.values(series)) v.splice(0, drop);

    if (prev && stats.frames.mute_alarms > prev.frames.mute_alarms) {
      const added = stats.frames.mute_alarms - prev.frames.mute_alarms;
      $('alarm-text').textContent =
        `Mute alarm: ${added} new (${num(stats.frames.mute_alarms)} in total). A session got ` +
        'no output for consecutive frames: the KV pool could not give it a block.';
      $('alarm').hidden = false;
      state.alarmUntil = now + ALARM_HOLD_MS;
    } else if (state.alarmUntil && now > state.alarmUntil) {
      $('alarm').hidden = true;
      state.alarmUntil = 0;
    }
  }

  function renderTiles(stats) {
    const s = stats.sessions;
    const limit = stats.admission.limit;
    setTile('active', num(s.active), limit == null ? 'no limit' : `limit ${num(limit)}`,
            limit != null && s.active >= limit ? 'warn' : null);
    setTile('admitted', num(s.admitted), `ended by error ${num(s.ended_by_error)}`,
            s.ended_by_error > 0 ? 'warn' : null);
    setTile('rejected', num(s.rejected), `limit changes ${num(stats.admission.limit_changes)}`,
            s.rejected > 0 ? 'warn' : null);

    const p99 = stats.latency_ms ? stats.latency_ms.p99 : null;
    const p50 = stats.latency_ms ? stats.latency_ms.p50 : null;
    const d = state.deadlineMs;
    let level = null;
    if (p99 != null && d != null) level = p99 > d ? 'bad' : p99 > 0.85 * d ? 'warn' : 'good';
    setTile('p99', p99 == null ? '–' : `${ms(p99)}<small> / ${d == null ? '–' : ms(d)} ms</small>`,
            `p50 ${ms(p50)} ms${d == null ? '' : ` · deadline ${ms(d)} ms`}`, level);

    const kv = stats.kv;
    const pct = kv.total_blocks > 0 ? (100 * kv.used_blocks) / kv.total_blocks : 0;
    setTile('kv', `${pct.toFixed(1)}<small> %</small>`,
            `${num(kv.used_blocks)} / ${num(kv.total_blocks)} blocks · peak ${(100 * (kv.peak_fraction || 0)).toFixed(0)} %`,
            pct >= 95 ? 'bad' : pct >= 80 ? 'warn' : 'good');

    const f = stats.forecast || {};
    if (f.t_sat_s == null) {
      setTile('forecast', 'never', 'pool cannot fill at this load', 'good');
    } else if (f.t_sat_s <= 0 || kv.free_blocks === 0) {
      setTile('forecast', 'full', 'no free KV blocks', 'bad');
    } else {
      setTile('forecast', `${duration(f.t_sat_s)}`, f.warning ? 'warning: pool fills soon' : 'until the pool is full',
              f.warning ? 'bad' : 'warn');
    }
    $('kv-hint').textContent = f.t_sat_s == null ? '% of blocks in use; forecast: never full'
      : f.t_sat_s <= 0 || kv.free_blocks === 0 ? '% of blocks in use; the pool is full'
        : `% of blocks in use; forecast: full in ${duration(f.t_sat_s)}`;

    const fr = stats.frames;
    const bad = fr.starved + fr.short;
    const okPct = fr.total > 0 ? (100 * fr.ok) / fr.total : null;
    setTile('frames', num(fr.total),
            `ok ${okPct == null ? '–' : okPct.toFixed(okPct >= 99.95 ? 0 : 1)}% · late ${num(fr.late)} · starved ${num(fr.starved)} · mute ${num(fr.mute_alarms)}`,
            bad > 0 || fr.mute_alarms > 0 ? 'bad' : fr.late > 0 ? 'warn' : fr.total > 0 ? 'good' : null);

    // Continuity: sessions handed between replicas (a drain), taken back after a dropped
    // connection, and any whose moved state nobody fetched (lost: their clients start over).
    const c = stats.continuity || {};
    const kib = (b) => `${num(Math.round((b || 0) / 1024))} KiB`;
    setTile('moves', `${num(c.moved_in || 0)}<small> / ${num(c.moved_out || 0)}</small>`,
            `resumed ${num(c.resumed || 0)} · lost ${num(c.moved_lost || 0)} · ` +
            `${kib(c.state_bytes_in)} in / ${kib(c.state_bytes_out)} out`,
            c.moved_lost > 0 ? 'bad' : c.detached > 0 || c.moving > 0 ? 'warn' : null);

    $('admission-hint').textContent =
      limit == null ? 'active sessions; this controller sets no limit' : 'limit vs active sessions';
    $('controller').textContent = `admission: ${stats.admission.controller}`;
    $('uptime').textContent = `t = ${duration(stats.t_s)}`;
  }

  function renderSessions(stats) {
    const list = stats.sessions.list || [];
    const cell = (v, cls = 'num') => `<td class="${cls}${v === 0 ? ' zero' : ''}">${num(v)}</td>`;
    const rows = list.map((r) => {
      const d = r.deadline_ms;
      let latClass = 'num';
      if (d && r.last_latency_ms > d) latClass += ' hot';
      else if (d && r.last_latency_ms > 0.85 * d) latClass += ' warm';
      const pd = r.period_ms == null ? '–' : `${ms(r.period_ms)} / ${ms(d)} ms`;
      return `<tr><td class="id">${escapeHtml(r.id)}</td>` +
        `<td class="num">${duration(r.age_s)}</td><td class="num">${pd}</td>` +
        `${cell(r.resident_blocks)}${cell(r.ok)}` +
        `${cell(r.late, r.late > 0 ? 'num warm' : 'num')}` +
        `${cell(r.starved, r.starved > 0 ? 'num hot' : 'num')}` +
        `${cell(r.short, r.short > 0 ? 'num hot' : 'num')}` +
        `<td class="${latClass}">${ms(r.last_latency_ms)} ms</td></tr>`;
    });
    document.querySelector('#sessions tbody').innerHTML = rows.join('');
    $('sessions-empty').hidden = list.length > 0;
    const listed = stats.sessions.listed ?? list.length;
    $('sessions-hint').textContent = stats.sessions.active > listed
      ? `first ${num(listed)} of ${num(stats.sessions.active)} live sessions`
      : `${num(list.length)} live`;
  }

  function setConnection(kind, text) {
    $('conn').className = `conn conn-${kind}`;
    $('conn-text').textContent = text;
  }

  async function poll() {
    const started = Date.now();
    try {
      const [statsRes, metricsRes] = await Promise.all([get('/v1/stats', true), get('/metrics', false)]);
      const stats = await statsRes.json();
      const metrics = await metricsRes.text();
      if (stats.stopped) throw new Error('the server is shutting down');
      const now = Date.now();
      const buckets = histogramBuckets(metrics, LATENCY_HISTOGRAM);
      record(stats, buckets, now);
      renderTiles(stats);
      renderSessions(stats);
      if (state.chartsEnabled) redrawCharts();
      prevStats = stats;
      prevBuckets = buckets;
      state.lastStats = stats;
      state.lastPollAt = now;
      state.polls += 1;
      $('notice-auth').hidden = true;
      $('notice-error').hidden = true;
      setConnection('live', 'live');
    } catch (e) {
      state.errors += 1;
      state.lastError = String(e && e.message ? e.message : e);
      if (e && e.status === 401) {
        $('notice-auth').hidden = false;
        setConnection('error', 'unauthorized');
      } else {
        $('notice-error').textContent = `cannot reach the server: ${state.lastError}`;
        $('notice-error').hidden = Date.now() - state.lastPollAt < STALE_MS;
        setConnection(Date.now() - state.lastPollAt < STALE_MS ? 'stale' : 'error',
                      state.lastPollAt ? 'stale' : 'offline');
      }
    }
    setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
  }

  $('alarm-dismiss').addEventListener('click', () => {
    $('alarm').hidden = true;
    state.alarmUntil = 0;
  });
  if (state.chartsEnabled) {
    initCharts();
  } else {
    $('notice-lib').hidden = false;
    for (const el of document.querySelectorAll('.chart')) {
      el.innerHTML = '<div class="chart-off">chart library not installed: run scripts/setup.sh</div>';
    }
  }
  poll();
})();
