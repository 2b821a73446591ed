// The web console end to end in headless Debian chromium (issue 19), against a real node
// that scripts/console-e2e.sh started: sign in, create a KB (and see the API's error at the
// form for a bad name), upload three files and watch each reach `ready`, add a page by URL
// (served here on 127.0.0.1, which the node is started to allow) and watch it reach `ready`,
// see a refused URL's error at the form, filter the list by status, list them, search
// and open an explain; on the Graph page find an entity as you type, see its neighbourhood
// drawn, recentre on a neighbour (by mouse and by keyboard), open a chunk that mentions it and
// its whole document, find a path, list the communities with summaries, and see an unknown
// entity and a KB without a graph in
// words; ask a question of the scripted model (fake-llm.mjs) and see its
// thoughts, tool call and answer stream, reload mid-answer and see the run resume, open a
// citation, stop a run, delete a document and see it leave the search and the KB's size, see
// the cluster and its rebalancing (none), switch to Chinese; no console errors anywhere and
// no serious or critical axe-core finding on any page.
// Environment: CONSOLE_URL (the page), SIFT_KEY (an admin key), API_BASE (only when the page
// is served apart from the node), SCREENSHOTS (a folder: one PNG per page), CHROMIUM.
// With SCREENSHOTS the PNGs are deterministic, so that a rerun with no change to the console
// rewrites none of them: the page's clock stands still, the node's answers reach the page
// with fixed times, durations and Raft indexes (`steady`), loopback ports are drawn as one,
// the KB has one shard (documents are placed by their ids, new in every run), and chromium
// rasterizes whole tiles.
import { mkdtempSync, rmSync, mkdirSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const url = process.env.CONSOLE_URL;
const apiKey = process.env.SIFT_KEY;
const apiBase = process.env.API_BASE || '';
const shots = process.env.SCREENSHOTS || '';
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
if (!url || !apiKey) throw new Error('CONSOLE_URL and SIFT_KEY are needed');

const profile = mkdtempSync(join(tmpdir(), 'sift-console-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath,
  headless: true,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    // without it, rounded corners come out a shade apart from one run to the next
    // (partial raster re-rasterizes parts of tiles); sRGB wherever it runs
    ...(shots ? ['--disable-partial-raster', '--force-color-profile=srgb'] : []),
  ],
  locale: 'en-US',
  timezoneId: 'UTC',
  viewport: { width: 1280, height: 860 },
});
const errors = [];
// Chromium logs each refused request as an error; the one the test provokes is let through.
let refusalExpected = false;
let failed = false;
const page = context.pages()[0] || (await context.newPage());
page.on('console', (message) => {
  if (message.type() !== 'error') return;
  if (refusalExpected && /status of 40[04]/.test(message.text())) {
    refusalExpected = false;
    return;
  }
  errors.push(`console: ${message.text()}`);
});
page.on('pageerror', (error) => errors.push(`page: ${error.message}`));
page.on('dialog', (dialog) => dialog.accept());
if (apiBase) {
  await page.addInitScript((base) => localStorage.setItem('sift.apiBase', base), apiBase);
}
page.setDefaultTimeout(30_000);

/** The instant the page's clock shows, and every time in the node's answers, in screenshot mode. */
const FIXED_MS = Date.UTC(2027, 0, 15, 9, 30);
/** Fields of the node's answers that differ from run to run whatever the console does. */
const TIMES = /_at_ms$|^since_ms$/;
const INDEXES = new Set(['applied', 'commit', 'matched']);

/** `answer` with its times, durations and Raft indexes fixed. */
function steadyAnswer(value, key = '') {
  if (Array.isArray(value)) return value.map((item) => steadyAnswer(item, key));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([name, inner]) => [
      name,
      name === 'timings' && inner && typeof inner === 'object'
        ? Object.fromEntries(Object.keys(inner).map((step) => [step, 1]))
        : steadyAnswer(inner, name),
    ]));
  }
  if (typeof value !== 'number') return value;
  if (TIMES.test(key)) return FIXED_MS;
  if (INDEXES.has(key)) return 100;
  if (key === 'last_contact_ms') return 0;
  return value;
}

/** Passes a request of the page to the node; a JSON answer comes back steady (event streams
 * and uploads pass untouched). */
async function steady(route) {
  const request = route.request();
  const json = request.method() === 'GET' || /\/search$/.test(new URL(request.url()).pathname);
  if (!json || (request.headers().accept || '').includes('text/event-stream')) return route.fallback();
  const response = await route.fetch();
  if (!(response.headers()['content-type'] || '').startsWith('application/json')) return route.fulfill({ response });
  return route.fulfill({ response, json: steadyAnswer(await response.json()) });
}

if (shots) await page.route((address) => address.pathname.startsWith('/v1/'), steady);

// A page for the node to fetch by URL, on 127.0.0.1 only (the node allows 127.0.0.1/32).
const article = `<!doctype html><html><head><title>Lighthouse history</title></head><body>
<nav><a href="/">Home</a></nav><main><article><h1>Lighthouse history</h1>
<p>The Pharos of Alexandria was one of the first lighthouses, built on an island at the harbour entrance.</p>
<p>Fresnel lenses, invented in 1822, let a small lamp throw a beam that ships could see far out at sea.</p>
</article></main><footer>Site footer</footer></body></html>`;
const pages = createServer((request, response) => {
  response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
  response.end(article);
});
await new Promise((resolve) => pages.listen(0, '127.0.0.1', resolve));
const articleUrl = `http://127.0.0.1:${pages.address().port}/lighthouse-history.html`;
const apiOrigin = apiBase || new URL(url).origin;

/** Calls the node's API with the admin key (for what the test sets up outside the console). */
async function callApi(method, path, body) {
  const response = await fetch(apiOrigin + path, {
    method,
    headers: { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const answer = text ? JSON.parse(text) : null;
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${JSON.stringify(answer)}`);
  return answer;
}

function step(name) {
  console.log(`console-e2e: ${name}`);
}

async function shot(name, { fullPage = false } = {}) {
  if (!shots) return;
  mkdirSync(shots, { recursive: true });
  // no caret, no transition half way, no focus ring that depends on how the page was reached;
  // the loopback ports (the node's, the test's page server's) drawn as one fixed port
  await page.evaluate(() => {
    document.activeElement?.blur();
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const steady = node.data.replace(/127\.0\.0\.1:\d+/g, '127.0.0.1:7700');
      if (steady !== node.data) node.data = steady;
    }
  });
  await page.screenshot({ path: join(shots, `${name}.png`), animations: 'disabled', caret: 'hide', fullPage });
}

/** The size the KB list shows for `kb`: its text and the bytes behind it. */
async function listedSize(kb) {
  const cell = page.locator(`tr[data-kb="${kb}"] td[data-bytes]`);
  await cell.waitFor();
  return { text: (await cell.textContent()).trim(), bytes: Number(await cell.getAttribute('data-bytes')) };
}

// evaluated rather than added as a script tag, which the content security policy refuses
const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
const violations = [];

/** An axe-core scan of the page as it is; serious and critical violations are kept. */
async function scan(name) {
  await page.evaluate(axeSource);
  const found = await page.evaluate(async () => {
    const result = await window.axe.run(document, { resultTypes: ['violations'] });
    return result.violations.map((violation) => ({
      impact: violation.impact,
      text: `${violation.id} (${violation.impact}): ${violation.nodes.map((node) => node.target.join(' ')).join(', ')}`,
    }));
  });
  const serious = found.filter((violation) => ['serious', 'critical'].includes(violation.impact));
  console.log(`console-e2e: axe on ${name}: ${found.length} findings, ${serious.length} serious${found.length ? `: ${found.map((violation) => violation.text).join('; ')}` : ''}`);
  violations.push(...serious.map((violation) => `${name}: ${violation.text}`));
}

async function expectText(locator, text) {
  await locator.filter({ hasText: text }).first().waitFor();
}

let tidesBytes = 0;
const shards = shots ? 1 : 2;
try {
  step('sign in');
  await page.goto(url);
  const paint = await page.evaluate(() => new Promise((resolve) => {
    const entry = () => performance.getEntriesByName('first-contentful-paint')[0];
    const poll = () => (entry() ? resolve(entry().startTime) : setTimeout(poll, 20));
    poll();
  }));
  const assets = new URL('../../node/console/', import.meta.url);
  const bytes = readdirSync(assets).reduce((sum, name) => sum + statSync(new URL(name, assets)).size, 0);
  console.log(`console-e2e: bench: first contentful paint ${paint.toFixed(0)} ms; the console is ${bytes} bytes in the binary`);
  // after the paint is measured: the fake clock's `performance` has no paint entries
  if (shots) await page.clock.setFixedTime(FIXED_MS);
  // the picture shows a key of the same length that is the same in every run
  await page.getByLabel('API key').fill(apiKey.replace(/[0-9a-f]/g, '0'));
  await shot('sign-in');
  await page.getByLabel('API key').fill(apiKey);
  await scan('sign-in');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Knowledge bases', level: 1 }).waitFor();

  step('a refused KB name is shown at the field');
  refusalExpected = true;
  await page.getByLabel('Name', { exact: true }).fill('not a name!');
  await page.getByRole('button', { name: 'Create', exact: true }).click();
  await page.locator('.field-error').filter({ hasText: /invalid_name/ }).waitFor();

  step('create a KB');
  await page.getByLabel('Name', { exact: true }).fill('handbook');
  // One shard for the screenshots: documents are placed by their ids, new in every run, and the
  // shards' counts and BM25 statistics (so the search's scores) would follow.
  await page.getByLabel('Shards', { exact: true }).fill(String(shards));
  await page.getByRole('button', { name: 'Create', exact: true }).click();
  await page.locator('tr[data-kb="handbook"]').waitFor();
  const fresh = await listedSize('handbook');
  if (fresh.bytes !== 0 || fresh.text !== '0 B') throw new Error(`a new KB's size is ${JSON.stringify(fresh)}`);
  await shot('knowledge-bases');

  step('edit a KB\'s settings: a refused value at its field, then a change saved');
  refusalExpected = true;
  await page.getByRole('button', { name: 'Settings handbook' }).click();
  await page.locator('#dialog').getByLabel('mmr_lambda').fill('5');
  await page.locator('#dialog').getByRole('button', { name: 'Save' }).click();
  await page.locator('#dialog .field-error').filter({ hasText: /invalid_mmr_lambda/ }).waitFor();
  await page.locator('#dialog').getByLabel('mmr_lambda').fill('0.5');
  await page.locator('#dialog').getByLabel('Chunk tokens').fill('200');
  await page.locator('#dialog').getByRole('button', { name: 'Save' }).click();
  await page.locator('#dialog').waitFor({ state: 'hidden' });
  await page.getByRole('button', { name: 'Settings handbook' }).click();
  const saved = await page.locator('#dialog').getByLabel('Chunk tokens').inputValue();
  if (saved !== '200') throw new Error(`chunk_tokens is ${saved} after the save, not 200`);
  const extractor = await page.locator('#dialog').getByLabel('Entity graph').inputValue();
  if (extractor !== 'embedded') throw new Error(`the graph extractor reads ${extractor}, not embedded`);
  await scan('kb-settings');
  await page.getByRole('button', { name: 'Close' }).click();
  await scan('knowledge-bases');

  step('upload three files and watch each reach ready');
  const tides = Buffer.from('Tides rise and fall twice a day because of the pull of the moon and the sun.\nSpring tides happen at full and new moon.\n');
  tidesBytes = tides.length;
  await page.getByRole('link', { name: 'handbook', exact: true }).click();
  await page.locator('#upload-files').setInputFiles([
    {
      name: 'lighthouses.md',
      mimeType: 'text/markdown',
      // people and places for the entity graph: Grace Darling, William Darling, Longstone, the
      // Farne Islands (also in harbours.md), which lead on to Seahouses
      buffer: Buffer.from('# Lighthouses\n\nLighthouses guide ships along the coast at night with a rotating beam of light.\n\n## Keepers\n\nKeepers trimmed the wicks and wound the clockwork every few hours. Grace Darling and her father William Darling kept the Longstone lighthouse on the Farne Islands.\n'),
    },
    {
      name: 'tides.txt',
      mimeType: 'text/plain',
      buffer: tides,
    },
    {
      name: 'harbours.md',
      mimeType: 'text/markdown',
      buffer: Buffer.from('# Harbours\n\nA harbour is a sheltered body of water where ships can anchor safely. Boats from the Farne Islands shelter in the harbour at Seahouses.\n'),
    },
  ]);
  for (const name of ['lighthouses.md', 'tides.txt', 'harbours.md']) {
    await page.locator(`.upload[data-file="${name}"][data-status="ready"]`).waitFor({ timeout: 120_000 });
  }
  await page.locator('tr[data-status="ready"]').nth(2).waitFor();

  step('add by URL: a refused address at the form, then a page that reaches ready');
  refusalExpected = true;
  await page.getByLabel('URLs', { exact: true }).fill('http://10.0.0.1/');
  await page.getByRole('button', { name: 'Add', exact: true }).click();
  await page.locator('#add-urls-error').filter({ hasText: /forbidden_url/ }).waitFor();
  await page.getByLabel('URLs', { exact: true }).fill(`${articleUrl}\n`);
  await page.getByRole('button', { name: 'Add', exact: true }).click();
  await page.locator('#add-urls-error').filter({ hasText: /\S/ }).waitFor({ state: 'detached' });
  await page.locator(`.upload[data-url="${articleUrl}"][data-status="ready"]`).waitFor({ timeout: 120_000 });
  await page.locator('tr[data-status="ready"]').nth(3).waitFor();
  await shot('documents');
  await scan('documents');

  step('filter the list by status on the node');
  // a document that fails in the pipeline (HTML with no content), added through the API
  const [empty] = (await callApi('POST', '/v1/kbs/handbook/documents', {
    documents: [{ external_id: 'empty-html', title: 'Empty page', text: '<script>x()</script>', format: 'html' }],
  })).documents;
  for (let waited = 0; ; waited += 1) {
    const record = await callApi('GET', `/v1/kbs/handbook/documents/${empty.id}`);
    if (record.status === 'failed') break;
    if (waited > 600) throw new Error(`the empty page is ${record.status}, not failed`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const rowsBy = () => page.evaluate(() => ({
    ready: document.querySelectorAll('tr[data-status="ready"]').length,
    failed: document.querySelectorAll('tr[data-status="failed"]').length,
  }));
  const status = page.locator('select[name="status"]');
  await status.selectOption('failed');
  await page.waitForFunction(() => document.querySelectorAll('tr[data-status="ready"]').length === 0
    && document.querySelectorAll('tr[data-status="failed"]').length === 1);
  await page.locator(`tr[data-document="${empty.id}"]`).waitFor();
  await status.selectOption('ready');
  await page.waitForFunction(() => document.querySelectorAll('tr[data-status="failed"]').length === 0
    && document.querySelectorAll('tr[data-status="ready"]').length === 4);
  await status.selectOption('');
  await page.waitForFunction(() => document.querySelectorAll('tr[data-status]').length === 5);
  console.log(`console-e2e: status filter: ${JSON.stringify(await rowsBy())} unfiltered`);

  step('a document\'s chunks');
  await page.locator('tr[data-status="ready"]').first().getByRole('button', { name: 'Chunks' }).click();
  await page.locator('#dialog .chunks li').first().waitFor();
  // Its entity graph's state (ADR 0037): extracted after the document is ready.
  await page.locator('#dialog .graph-state').filter({ hasText: /Entity graph: (ready|being extracted)/ }).waitFor();
  await page.getByRole('button', { name: 'Close' }).click();

  step('search and open an explain');
  await page.getByRole('link', { name: 'Search', exact: true }).first().click();
  await page.getByLabel('Knowledge base', { exact: true }).selectOption('handbook');
  await page.getByLabel('Query', { exact: true }).fill('how do lighthouses guide ships');
  await page.getByText('Retrieval options').click();
  await page.getByLabel('context_tokens').fill('200');
  await page.getByLabel('mmr', { exact: true }).selectOption('true');
  await page.getByRole('button', { name: 'Search', exact: true }).last().click();
  await expectText(page.locator('.hit'), 'Lighthouses');
  await page.locator('.hit .explain summary').first().click();
  await page.locator('.hit .explain dl').first().waitFor({ state: 'visible' });
  await page.getByText(/Packed context: \d+ of 200 tokens/).waitFor();
  await shot('search');
  await scan('search');

  step('the graph: find an entity as you type, its neighbourhood, recentre, a mention, a path');
  // the graph is extracted just after `ready`: wait until the node knows both documents' names
  const entityId = {};
  for (let waited = 0; Object.keys(entityId).length < 2; waited += 1) {
    for (const name of ['Grace Darling', 'Seahouses']) {
      const { entities } = await callApi('GET', `/v1/kbs/handbook/graph/entities?q=${encodeURIComponent(name)}`);
      const found = entities.find((entity) => entity.name === name);
      if (found) entityId[name] = found.id;
    }
    if (waited > 600) throw new Error(`the graph has not got ${JSON.stringify(entityId)} after a minute`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await page.locator('#nav').getByRole('link', { name: 'Graph' }).click();
  await page.getByRole('heading', { name: 'Entity graph', level: 1 }).waitFor();
  await page.getByLabel('Knowledge base', { exact: true }).selectOption('handbook');
  await page.getByRole('searchbox', { name: 'Find an entity' }).pressSequentially('grace', { delay: 40 });
  await page.locator('button.entity').filter({ hasText: 'Grace Darling' }).click();
  await page.locator('#graph-entity').filter({ hasText: 'Grace Darling' }).waitFor();
  const drawn = await page.locator('.graph-view svg .graph-node').count();
  if (drawn < 2) throw new Error(`the neighbourhood of Grace Darling has ${drawn} nodes`);
  const node = (name) => page.locator(`.graph-node[aria-label^="${name} ("]`);
  await node('William Darling').click();
  await page.locator('#graph-entity').filter({ hasText: 'William Darling' }).waitFor();
  await node('Grace Darling').waitFor();
  // keyboard: a neighbour is focusable and Enter puts it in the centre
  await node('Grace Darling').focus();
  await page.keyboard.press('Enter');
  await page.locator('#graph-entity').filter({ hasText: 'Grace Darling' }).waitFor();
  console.log(`console-e2e: graph: ${drawn} nodes around Grace Darling`);
  await page.locator('.mentions li').first().getByRole('button').click();
  await page.locator('#dialog .chunk-text mark').filter({ hasText: 'Grace Darling' }).waitFor();
  await page.getByRole('button', { name: 'Show the whole document' }).click();
  await page.locator('#dialog .chunks li.current').filter({ hasText: 'Grace Darling' }).waitFor();
  await page.getByRole('button', { name: 'Close' }).click();
  const from = await page.getByLabel('From', { exact: true }).inputValue();
  if (from !== 'Grace Darling') throw new Error(`the path starts from ${JSON.stringify(from)}`);
  await page.getByLabel('To', { exact: true }).fill('Seahouses');
  await page.getByRole('button', { name: 'Find the path' }).click();
  await page.locator('.path .path-entity').last().filter({ hasText: 'Seahouses' }).waitFor();
  await page.locator('.path .path-chunk button').first().waitFor();
  const hops = await page.locator('.path .path-chunk').count();
  if (hops < 1) throw new Error('the path has no chunk');
  // the KB's communities (ADR 0039): the keepers and their lighthouse together; summaries by
  // the scripted model (which echoes what it is asked: the members' names and the passages)
  await page.getByRole('button', { name: 'Show communities' }).click();
  await page.locator('.communities .community').first().waitFor();
  const members = await page.locator('.communities .community .members .name').allInnerTexts();
  if (!members.includes('Grace Darling') || !members.includes('William Darling')) {
    throw new Error(`no community holds the Darlings: ${JSON.stringify(members)}`);
  }
  await page.getByLabel('Summarise with the chat model').check();
  await page.getByRole('button', { name: 'Show communities' }).click();
  await page.locator('.communities .community .summary').filter({ hasText: 'Grace Darling' }).first().waitFor();
  console.log(`console-e2e: graph: ${await page.locator('.communities .community').count()} communities`);
  await shot('graph', { fullPage: true });
  await scan('graph');

  step('the graph: an unknown entity and a KB without a graph, in words');
  refusalExpected = true;
  await page.evaluate(() => { location.hash = '#/graph?kb=handbook&entity=Nobody%20Here'; });
  await page.locator('.graph-view .notice').filter({ hasText: 'Not found' }).waitFor();
  await callApi('POST', '/v1/kbs', { name: 'plain', shards: 1, graph: 'off' });
  await page.evaluate(() => { location.hash = '#/graph?kb=plain'; });
  await page.locator('.graph-view .notice').filter({ hasText: 'no entity graph' }).waitFor();
  await callApi('DELETE', '/v1/kbs/plain');

  step('delete a document and see it leave the search and the KB\'s size');
  await page.locator('#nav').getByRole('link', { name: 'Knowledge bases' }).click();
  const before = await listedSize('handbook');
  const stored = (await callApi('GET', '/v1/kbs/handbook')).stored_bytes;
  if (before.bytes !== stored || !/^\d+(\.\d)? (B|KiB)$/.test(before.text) || before.bytes < tidesBytes) {
    throw new Error(`the KB list shows ${JSON.stringify(before)}; the node says ${stored} bytes`);
  }
  await page.getByRole('link', { name: 'handbook', exact: true }).click();
  await page.getByRole('button', { name: 'Delete tides.txt' }).click();
  await page.getByRole('button', { name: 'Delete tides.txt' }).waitFor({ state: 'detached' });
  await page.locator('#nav').getByRole('link', { name: 'Search' }).click();
  await page.getByLabel('Knowledge base', { exact: true }).selectOption('handbook');
  await page.getByLabel('Query', { exact: true }).fill('tides moon');
  await page.getByRole('button', { name: 'Search', exact: true }).last().click();
  await page.locator('.summary').waitFor();
  const tidesHits = await page.locator('.hit').filter({ hasText: 'tides.txt' }).count();
  if (tidesHits !== 0) throw new Error('the deleted document is still found');
  await page.locator('#nav').getByRole('link', { name: 'Knowledge bases' }).click();
  const after = await listedSize('handbook');
  if (after.bytes !== before.bytes - tidesBytes) {
    throw new Error(`the KB list shows ${after.bytes} bytes after deleting ${tidesBytes} of ${before.bytes}`);
  }

  step('ask: thoughts, a tool call, the answer streamed; reload mid-answer and resume');
  await page.getByRole('link', { name: 'Chat', exact: true }).click();
  await page.getByRole('checkbox', { name: 'handbook' }).check();
  await page.getByRole('button', { name: 'Start' }).click();
  await page.getByLabel('Question').fill('How do lighthouses guide ships?');
  await page.getByRole('button', { name: 'Ask' }).click();
  await page.locator('.turn .thoughts:not([hidden])').first().waitFor();
  await page.locator('.turn .tool').first().waitFor();
  // part of the answer is there while the run still goes on
  await page.locator('.turn[data-state="running"] .answer').filter({ hasText: /\S/ }).waitFor({ timeout: 60_000 });
  await page.reload();
  await page.locator('.turn .notice.info').first().waitFor();
  await page.locator('.turn:not([data-state="running"])').first().waitFor({ timeout: 60_000 });
  const turns = await page.locator('.turn').count();
  if (turns !== 1) throw new Error(`${turns} turns after the reload, not 1`);
  await page.locator('.turn .cite').first().click();
  await page.locator('#dialog .chunk-text mark').waitFor();
  await shot('chat-citation');
  await page.getByRole('button', { name: 'Close' }).click();

  step('stop a run');
  await page.getByLabel('Question').fill('Please ponder the tides');
  await page.getByRole('button', { name: 'Ask' }).click();
  await page.locator('.turn[data-state="running"] .thought-text').filter({ hasText: /ponder/ }).waitFor({ state: 'attached' });
  await page.getByRole('button', { name: 'Stop' }).click();
  await page.locator('.turn[data-state="stopped"]').waitFor();
  await page.locator('.turn .thoughts').first().evaluate((details) => { details.open = true; });
  await shot('chat');
  await scan('chat');

  step('a fast stream: 400 thoughts at about 200 a second, none dropped or out of order');
  await page.getByLabel('Question').fill('Please count to 400');
  await page.getByRole('button', { name: 'Ask' }).click();
  const fast = page.locator('.turn').last();
  await fast.locator('.thought-text').filter({ hasText: /^0 1 2 / }).waitFor({ state: 'attached' });
  const started = Date.now();
  await page.locator('.turn').last().and(page.locator(':not([data-state="running"])')).waitFor({ timeout: 60_000 });
  const seconds = (Date.now() - started) / 1000;
  const thought = await fast.locator('.thought-text').textContent();
  const expected = Array.from({ length: 400 }, (_, n) => `${n} `).join('');
  if (!thought.startsWith(expected)) throw new Error(`the thoughts are not 0 to 399 in order: ${thought.slice(0, 200)}…`);
  const events = Number(await fast.getAttribute('data-events'));
  console.log(`console-e2e: bench: ${events} run events drawn, the thoughts in ${seconds.toFixed(1)} s`);

  step('the cluster');
  await page.getByRole('link', { name: 'Cluster', exact: true }).click();
  await page.locator('tr[data-node]').first().waitFor();
  await page.getByLabel('Knowledge base', { exact: true }).selectOption('handbook');
  await page.locator('.badge.replica-active').nth(shards - 1).waitFor();
  await page.getByRole('heading', { name: 'Rebalancing', level: 2 }).waitFor();
  await page.locator('.rebalancing .empty').filter({ hasText: 'No rebalancing in progress' }).waitFor();
  await shot('cluster');
  await scan('cluster');

  step('switch to Chinese');
  await page.getByLabel('Language').selectOption('zh');
  await page.getByRole('link', { name: '知识库' }).first().waitFor();
  await page.getByRole('heading', { name: '集群', level: 1 }).waitFor();
  await page.locator('#nav').getByRole('link', { name: '知识库' }).click();
  await page.getByRole('heading', { name: '知识库', level: 1 }).waitFor();
  await page.locator('tr[data-kb="handbook"]').waitFor();
  await shot('knowledge-bases-zh');
  await scan('knowledge-bases-zh');

  step('phone width');
  await page.setViewportSize({ width: 390, height: 844 });
  await page.locator('#nav').getByRole('link', { name: '检索' }).click();
  await page.getByRole('heading', { name: '检索', level: 1 }).waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 0) throw new Error(`the page is ${overflow}px wider than a phone`);
  await shot('search-phone-zh');
  await page.evaluate((id) => { location.hash = `#/graph?kb=handbook&entity=${id}`; }, entityId['Grace Darling']);
  await page.getByRole('heading', { name: '实体图谱', level: 1 }).waitFor();
  await page.locator('#graph-entity').filter({ hasText: 'Grace Darling' }).waitFor();
  await page.locator('.graph-view svg .graph-node').nth(1).waitFor();
  const graphOverflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (graphOverflow > 0) throw new Error(`the graph page is ${graphOverflow}px wider than a phone`);
  await shot('graph-phone-zh');
  await scan('graph-zh');

  if (errors.length) throw new Error(`console errors:\n${errors.join('\n')}`);
  if (violations.length) throw new Error(`accessibility (axe-core):\n${violations.join('\n')}`);
  console.log('console-e2e: ok');
} catch (error) {
  failed = true;
  console.error(`console-e2e: FAILED: ${error.stack || error}`);
  if (errors.length) console.error(errors.join('\n'));
  try {
    await page.screenshot({ path: join(tmpdir(), 'sift-console-e2e-failure.png') });
    console.error(`console-e2e: screenshot at ${join(tmpdir(), 'sift-console-e2e-failure.png')}`);
  } catch {
    // the browser is gone
  }
} finally {
  await context.close();
  pages.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
