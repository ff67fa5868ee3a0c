// End-to-end test of the dashboard served by `metronome serve`, in headless Chromium: starts a
// server (with an access token), puts load on it, opens /#token=T and checks that the page polls,
// that its charts' data grows, that the session table fills, and that nothing is logged as an
// error; then saves a screenshot.
//
//   node tests/dashboard/dashboard_test.mjs BUILD/apps/metronome [SCREENSHOT.png]
//
// Load comes from `metronome loadgen` when the binary has it, otherwise from a second browser
// page speaking docs/protocol.md (METRONOME_DASHBOARD_LOAD=loadgen|browser forces one). A browser
// cannot put a token on a WebSocket upgrade, so that fallback runs the server without one.
//
// Exit status: 0 pass, 1 fail, 77 skip (no Chromium or no web/node_modules; a failure instead
// when CI=true, so CI cannot pass by skipping). Everything started here is stopped on every exit
// path, and the whole run is bounded by TIME_LIMIT_MS.
import {spawn, spawnSync} from 'node:child_process';
import {randomBytes} from 'node:crypto';
import {existsSync} from 'node:fs';
import {createRequire} from 'node:module';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const TIME_LIMIT_MS = 60_000;
const here = path.dirname(fileURLToPath(import.meta.url));
const webDir = process.env.METRONOME_WEB_DIR || path.resolve(here, '../../web');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const binary = process.argv[2];
const screenshotPath = process.argv[3] || process.env.DASHBOARD_SCREENSHOT ||
    (binary ? path.resolve(path.dirname(binary), '..', 'dashboard.png') : 'dashboard.png');

const log = (...a) => console.log('[dashboard-test]', ...a);
const children = [];
let browser = null;
let finished = false;

async function cleanup() {
  if (browser) {
    const b = browser;
    browser = null;
    await Promise.race([b.close().catch(() => {}), new Promise((r) => setTimeout(r, 5000))]);
  }
  for (const c of children) {
    if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
  }
  const deadline = Date.now() + 3000;
  for (const c of children) {
    while (c.exitCode === null && c.signalCode === null && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  }
}

async function finish(code, message) {
  if (finished) return;
  finished = true;
  if (message) (code === 0 ? log : console.error)(message);
  await cleanup();
  process.exit(code);
}

function skip(why) {
  if (process.env.CI === 'true') return finish(1, `FAIL (CI=true, so not skipping): ${why}`);
  return finish(77, `SKIP: ${why}`);
}

process.on('SIGINT', () => finish(1, 'interrupted'));
process.on('SIGTERM', () => finish(1, 'terminated'));
process.on('unhandledRejection', (e) => finish(1, `FAIL: ${e && e.stack ? e.stack : e}`));
process.on('uncaughtException', (e) => finish(1, `FAIL: ${e && e.stack ? e.stack : e}`));
setTimeout(() => finish(1, `FAIL: did not finish within ${TIME_LIMIT_MS / 1000} s`),
           TIME_LIMIT_MS).unref();

function check(cond, what) {
  if (!cond) throw new Error(what);
}

// Starts `metronome serve` and resolves with its port once it prints "listening on ...".
function startServer(token) {
  const args = ['serve', '--model', 'synthetic:tiny', '--port', '0', '--threads', '1', '--quiet'];
  if (token) args.push('--auth-token', token);
  const server = spawn(binary, args, {stdio: ['ignore', 'pipe', 'pipe']});
  children.push(server);
  let out = '';
  let err = '';
  server.stderr.on('data', (d) => { err = (err + d).slice(-4000); });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in 15 s:\n${out}${err}`)),
                             15_000);
    server.stdout.on('data', (d) => {
      out += d;
      const m = /listening on http:\/\/([^:\s]+):(\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[2]));
      }
    });
    server.on('exit', (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code ?? sig}):\n${out}${err}`));
    });
  });
}

function hasLoadgen() {
  const r = spawnSync(binary, ['loadgen', '--help'], {stdio: 'ignore', timeout: 5000});
  return r.status === 0;
}

function startLoadgen(port, token) {
  const args = ['loadgen', '--url', `ws://127.0.0.1:${port}`, '--sessions', '4', '--duration',
    '20', '--period-ms', '100', '--kv', 'window', '--quiet', '--auth-token', token];
  const lg = spawn(binary, args, {stdio: ['ignore', 'ignore', 'pipe']});
  children.push(lg);
  lg.stderr.on('data', (d) => { lg.stderrTail = ((lg.stderrTail || '') + d).slice(-2000); });
  return lg;
}

// Four paced sessions from a page of the server's own origin (docs/protocol.md: session.start,
// then one frame per period).
async function startBrowserLoad(context, port) {
  const page = await context.newPage();
  await page.goto(`http://127.0.0.1:${port}/healthz`);
  await page.evaluate((url) => new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    window.loadSocket = ws;
    let started = 0;
    ws.onerror = () => reject(new Error('load WebSocket failed'));
    ws.onopen = () => {
      for (let i = 0; i < 4; ++i) {
        ws.send(JSON.stringify({type: 'session.start', period_ms: 100, tokens_per_frame: 1,
          kv: {policy: 'window'}, client_ref: `load-${i}`}));
      }
    };
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.type === 'session.started') {
        let index = 0;
        setInterval(() => {
          ws.send(JSON.stringify({type: 'frame', session: m.session, index: index++,
            ids: [1 + (index % 200)]}));
        }, 100);
        if (++started === 4) resolve();
      } else if (m.type === 'session.rejected' || m.type === 'error') {
        reject(new Error(`load session: ${ev.data}`));
      }
    };
  }), `ws://127.0.0.1:${port}/v1/realtime`);
  return page;
}

async function main() {
  if (!binary || !existsSync(binary)) return finish(1, `usage: dashboard_test.mjs METRONOME_BINARY [PNG] (got ${binary})`);
  if (!existsSync(chromiumPath)) return skip(`no Chromium at ${chromiumPath} (run scripts/setup.sh)`);
  let chromium;
  try {
    ({chromium} = createRequire(path.join(webDir, 'package.json'))('playwright-core'));
  } catch (e) {
    return skip(`playwright-core not installed in ${webDir}/node_modules (run scripts/setup.sh)`);
  }

  const mode = process.env.METRONOME_DASHBOARD_LOAD || (hasLoadgen() ? 'loadgen' : 'browser');
  const token = mode === 'loadgen' ? randomBytes(8).toString('hex') : '';
  const port = await startServer(token);
  log(`server on port ${port}; load from ${mode}`);

  browser = await chromium.launch({executablePath: chromiumPath, args: ['--no-sandbox'],
    timeout: 20_000});
  const context = await browser.newContext({viewport: {width: 1440, height: 900}});
  let loadgen = null;
  if (mode === 'loadgen') loadgen = startLoadgen(port, token);
  else await startBrowserLoad(context, port);

  const page = await context.newPage();
  const problems = [];
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()}`));
  await page.goto(`http://127.0.0.1:${port}/${token ? `#token=${token}` : ''}`);
  const state = () => page.evaluate(() => {
    const d = window.metronomeDashboard;
    return d && {polls: d.polls, errors: d.errors, lastError: d.lastError,
      chartsEnabled: d.chartsEnabled, lengths: d.lengths, stats: d.lastStats,
      series: d.series, rows: document.querySelectorAll('#sessions tbody tr').length,
      charts: document.querySelectorAll('.uplot').length};
  });

  await page.waitForFunction(() => window.metronomeDashboard?.polls >= 2, null, {timeout: 15_000});
  const early = await state();
  await page.waitForFunction(() => {
    const d = window.metronomeDashboard;
    return d.polls >= 6 && d.lastStats.frames.total > 0 &&
        d.series.p99.some((v) => Number.isFinite(v)) &&
        document.querySelectorAll('#sessions tbody tr').length > 0;
  }, null, {timeout: 25_000, polling: 250}).catch(async () => {
    const s = await state();
    throw new Error(`the dashboard did not fill in: ${JSON.stringify({...s, series: undefined})}` +
        (loadgen ? `\nloadgen (exit ${loadgen.exitCode}): ${loadgen.stderrTail || ''}` : ''));
  });
  // One more poll so the forecast and table have settled before the picture.
  const target = (await state()).polls + 1;
  await page.waitForFunction((n) => window.metronomeDashboard.polls >= n, target, {timeout: 5000});
  const s = await state();

  check(s.chartsEnabled, 'uPlot is not embedded: rebuild after scripts/setup.sh installed web/node_modules');
  check(s.charts === 4, `expected 4 charts, found ${s.charts}`);
  check(s.polls > early.polls, 'polls did not advance');
  check(s.stats.frames.total > early.stats.frames.total,
        `frames total did not grow: ${early.stats.frames.total} -> ${s.stats.frames.total}`);
  const lengths = Object.values(s.lengths);
  check(lengths.every((n) => n === s.lengths.t) && s.lengths.t >= 6,
        `series lengths: ${JSON.stringify(s.lengths)}`);
  check(s.lengths.t > early.lengths.t, 'chart data did not grow');
  check(s.series.p99.filter((v) => Number.isFinite(v)).length >= 2, 'no finite latency points');
  check(s.series.kvPct.every((v) => Number.isFinite(v)), 'KV occupancy has gaps');
  check(s.series.deadline.some((v) => v === 100), `deadline series: ${s.series.deadline}`);
  check(s.series.ok.some((v) => v > 0), 'no ok frames per interval');
  check(s.rows >= 1 && s.rows === s.stats.sessions.list.length, `session rows: ${s.rows}`);
  check(s.errors === 0, `failed polls: ${s.errors} (${s.lastError})`);
  // The continuity tile shows /v1/stats' counts (nothing moved here: 0 in, 0 out, 0 resumed).
  const moves = await page.$eval('#tile-moves', (e) => e.textContent.replace(/\s+/g, ' ').trim());
  check(/Moves in \/ out 0 \/ 0 resumed 0 · lost 0/.test(moves), `continuity tile: "${moves}"`);
  check(s.stats.continuity && s.stats.continuity.moved_in === 0 && s.stats.continuity.resumed === 0,
        `/v1/stats continuity: ${JSON.stringify(s.stats.continuity)}`);
  const tiles = await page.$$eval('.tile-value', (els) => els.map((e) => e.textContent.trim()));
  check(tiles.every((t) => t !== '–'), `empty tiles: ${tiles}`);
  check(await page.isHidden('#notice-lib') && await page.isHidden('#notice-auth'),
        'a notice is showing');
  check(problems.length === 0, `the page logged errors:\n  ${problems.join('\n  ')}`);

  await page.screenshot({path: screenshotPath, fullPage: true});
  log(`screenshot: ${screenshotPath}`);

  if (token) {
    // Without the token the page says what to do instead of showing nothing.
    const bare = await context.newPage();
    await bare.goto(`http://127.0.0.1:${port}/`);
    await bare.waitForSelector('#notice-auth', {state: 'visible', timeout: 5000});
    await bare.close();
  }
  return finish(0, `PASS: ${s.polls} polls, ${s.stats.frames.total} frames, ` +
      `${s.rows} sessions, p99 points ${s.series.p99.filter(Number.isFinite).length}`);
}

main().catch((e) => finish(1, `FAIL: ${e && e.stack ? e.stack : e}`));
