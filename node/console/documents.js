// A KB's documents: uploads (picker and drag and drop) and documents by URL, with a live
// progress row each from the document's event stream; the list a page at a time, filtered by
// status on the node (`?status=`); a document's chunks; delete.
import { api, stream, enc } from './api.js';
import { h, replace, field, formatBytes, formatTime, notice, openDialog } from './dom.js';
import { t, placeLabel, statusLabel } from './i18n.js';

const STATUSES = ['queued', 'parsing', 'chunking', 'embedding', 'indexing', 'ready', 'failed'];
const FINAL = new Set(['ready', 'failed', 'deleted']);
const PAGE = 50;

export function render(main, route) {
  const kb = route.parts[0];
  const streams = new AbortController();
  const state = { kb, after: null, previous: [], filter: '' };
  const list = h('div', { 'aria-live': 'polite' }, t('loading'));
  const reload = () => load(list, state);
  main.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/kbs' }, t('kbs.title')), ' / ', kb),
    h('h1', {}, t('docs.title', { kb })),
    uploader(kb, streams.signal, reload),
    urlForm(kb, streams.signal, reload),
    listControls(state, reload),
    list,
  );
  reload();
  return () => streams.abort();
}

function uploader(kb, signal, onFinal) {
  const input = h('input', { type: 'file', multiple: true, id: 'upload-files', class: 'visually-hidden' });
  const rows = h('ul', { class: 'uploads', 'aria-label': t('docs.uploads') });
  const zone = h(
    'div',
    { class: 'drop-zone' },
    h('p', {}, t('docs.drop')),
    h('label', { for: 'upload-files', class: 'button primary' }, t('docs.choose')),
    input,
  );
  const start = (files) => {
    for (const file of files) upload(kb, file, rows, signal, onFinal);
  };
  input.addEventListener('change', () => {
    start([...input.files]);
    input.value = '';
  });
  zone.addEventListener('dragover', (event) => {
    event.preventDefault();
    zone.classList.add('dragging');
  });
  zone.addEventListener('dragleave', () => zone.classList.remove('dragging'));
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    zone.classList.remove('dragging');
    start([...event.dataTransfer.files]);
  });
  return h('section', { class: 'card', 'aria-labelledby': 'upload-title' }, h('h2', { id: 'upload-title' }, t('docs.upload')), zone, rows);
}

/** A progress row in `rows`, labelled `name`; `show(status, event)` draws an event. */
function progressRow(rows, name, dataset) {
  const status = h('span', { class: 'status' }, t('docs.uploading'));
  const bar = h('progress', { max: 1, value: 0, 'aria-label': name });
  const detail = h('span', { class: 'detail' });
  const row = h('li', { class: 'upload', dataset: { ...dataset, status: 'uploading' } }, h('span', { class: 'name' }, name), bar, status, detail);
  rows.append(row);
  const show = (state, event = {}) => {
    row.dataset.status = state;
    status.textContent = statusLabel(state);
    status.className = `status badge status-${state}`;
    if (typeof event.progress === 'number') bar.value = event.progress;
    const steps = event.parse_pages || event.ocr_pages || event.embedded_chunks;
    detail.textContent = [
      steps ? `${steps.done}/${steps.total}` : '',
      event.chunk_count ? t('docs.chunkCount', { n: event.chunk_count }) : '',
      event.error || '',
    ]
      .filter(Boolean)
      .join(' · ');
  };
  return { row, bar, show };
}

/** Uploads one file and follows its document's events in a row of its own. */
async function upload(kb, file, rows, signal, onFinal) {
  const progress = progressRow(rows, file.name, { file: file.name });
  const form = new FormData();
  form.append('file', file, file.name);
  let document;
  try {
    const answer = await api('POST', `/v1/kbs/${enc(kb)}/documents`, form, signal);
    document = answer.documents[0];
  } catch (failed) {
    if (failed.name === 'AbortError') return;
    progress.show('failed', { error: `${failed.message} (${failed.code})` });
    return;
  }
  await follow(kb, document, progress, signal, onFinal);
}

/** Draws a document's events in its progress row until it is ready or failed. */
async function follow(kb, document, { row, bar, show }, signal, onFinal) {
  show(document.status || 'queued', document);
  let last = null;
  // The stream ends after the final event; a broken one is opened again (it starts with
  // the document's current status).
  for (let attempt = 0; attempt < 5 && !FINAL.has(row.dataset.status); attempt += 1) {
    try {
      await stream(`/v1/kbs/${enc(kb)}/documents/${enc(document.id)}/events`, {
        signal,
        onEvent: ({ event, data }) => {
          last = event;
          show(event, data);
        },
      });
    } catch (failed) {
      if (failed.name === 'AbortError') return;
      show('failed', { error: failed.message });
      return;
    }
  }
  // a duplicate may be ready already, without events
  if (last === 'ready' || row.dataset.status === 'ready') bar.value = 1;
  onFinal();
}

/**
 * Documents by URL: one a line, sent together (the node fetches them; all or nothing, so a
 * refused URL is shown at the field and nothing is added), then a progress row each.
 */
function urlForm(kb, signal, onFinal) {
  const urls = h('textarea', { id: 'add-urls', name: 'urls', rows: 3, placeholder: 'https://example.com/page', spellcheck: 'false' });
  const wrapper = field(t('docs.urls'), urls, t('docs.urlsHint'));
  const error = wrapper.querySelector('.field-error');
  const rows = h('ul', { class: 'uploads', 'aria-label': t('docs.urlRows') });
  const submit = h('button', { type: 'submit', class: 'primary' }, t('docs.addUrls'));
  const form = h(
    'form',
    { class: 'card', 'aria-labelledby': 'urls-title', novalidate: true },
    h('h2', { id: 'urls-title' }, t('docs.byUrl')),
    wrapper,
    submit,
    rows,
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.textContent = '';
    const list = urls.value.split('\n').map((line) => line.trim()).filter(Boolean);
    if (list.length === 0) {
      error.textContent = t('docs.urlsEmpty');
      urls.focus();
      return;
    }
    submit.disabled = true;
    let answer;
    try {
      answer = await api('POST', `/v1/kbs/${enc(kb)}/documents`, { urls: list }, signal);
    } catch (failed) {
      if (failed.name === 'AbortError') return;
      error.textContent = `${failed.message} (${failed.code})`;
      urls.focus();
      return;
    } finally {
      submit.disabled = false;
    }
    urls.value = '';
    // the answer lists the documents in the order of the URLs
    answer.documents.forEach((document, position) => {
      const url = list[position] ?? document.external_id ?? document.id;
      follow(kb, document, progressRow(rows, url, { url }), signal, onFinal);
    });
  });
  return form;
}

function listControls(state, reload) {
  const filter = h(
    'select',
    { name: 'status' },
    h('option', { value: '' }, t('docs.allStatuses')),
    STATUSES.map((status) => h('option', { value: status }, statusLabel(status))),
  );
  filter.addEventListener('change', () => {
    // the node filters, so the pages start again from the first
    state.filter = filter.value;
    state.after = null;
    state.previous = [];
    reload();
  });
  return h('div', { class: 'list-controls' }, h('h2', {}, t('docs.list')), field(t('docs.filter'), filter));
}

async function load(list, state) {
  let page;
  try {
    const after = state.after ? `&after=${enc(state.after)}` : '';
    const status = state.filter ? `&status=${enc(state.filter)}` : '';
    page = await api('GET', `/v1/kbs/${enc(state.kb)}/documents?limit=${PAGE}${after}${status}`);
  } catch (failed) {
    replace(list, notice('error', failed.message));
    return;
  }
  // a filtered page may be short (the node reads a bounded stretch per page) yet not the last
  const documents = page.documents;
  const pager = h(
    'div',
    { class: 'pager' },
    h('button', { type: 'button', disabled: state.previous.length === 0, onclick: () => {
      state.after = state.previous.pop() ?? null;
      load(list, state);
    } }, t('previous')),
    h('button', { type: 'button', disabled: !page.next_after, onclick: () => {
      state.previous.push(state.after);
      state.after = page.next_after;
      load(list, state);
    } }, t('next')),
  );
  if (documents.length === 0) {
    replace(list, h('p', { class: 'empty' }, t(page.next_after ? 'docs.noneHere' : 'docs.none')), pager);
    return;
  }
  const rows = documents.map((doc) => {
    const remove = h('button', { type: 'button', class: 'danger small', 'aria-label': `${t('delete')} ${doc.title}` }, t('delete'));
    remove.addEventListener('click', async () => {
      if (!confirm(t('docs.confirmDelete', { name: doc.title }))) return;
      try {
        await api('DELETE', `/v1/kbs/${enc(state.kb)}/documents/${enc(doc.id)}`);
        load(list, state);
      } catch (failed) {
        alert(failed.message);
      }
    });
    const chunks = h('button', { type: 'button', class: 'small' }, t('docs.chunks'));
    chunks.addEventListener('click', () => showChunks(state.kb, doc));
    return h(
      'tr',
      { dataset: { document: doc.id, status: doc.status } },
      h('th', { scope: 'row' }, doc.title || doc.external_id || doc.id),
      h('td', {}, h('span', { class: `badge status-${doc.status}` }, statusLabel(doc.status)), doc.error ? h('span', { class: 'detail' }, ` ${doc.error}`) : null),
      h('td', { class: 'num' }, doc.chunk_count),
      h('td', { class: 'num' }, formatBytes(doc.size_bytes)),
      h('td', {}, formatTime(doc.updated_at_ms)),
      h('td', { class: 'actions' }, chunks, remove),
    );
  });
  replace(
    list,
    h('div', { class: 'table-wrap' }, h(
      'table',
      {},
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, t('docs.name')),
        h('th', { scope: 'col' }, t('docs.status')),
        h('th', { scope: 'col' }, t('docs.chunks')),
        h('th', { scope: 'col' }, t('docs.size')),
        h('th', { scope: 'col' }, t('docs.updated')),
        h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, t('actions'))),
      )),
      h('tbody', {}, rows),
    )),
    pager,
  );
}

/** A document's chunks in the dialog; `current` (a chunk id) is marked and scrolled to. */
export async function showChunks(kb, doc, current) {
  openDialog(doc.title, t('loading'));
  try {
    const [{ chunks }, view] = await Promise.all([
      api('GET', `/v1/kbs/${enc(kb)}/documents/${enc(doc.id)}/chunks`),
      api('GET', `/v1/kbs/${enc(kb)}/documents/${enc(doc.id)}`).catch(() => null),
    ]);
    const graph = view?.graph
      ? h('p', { class: 'meta graph-state' },
        t('docs.graphState', { state: t(`docs.graph.${view.graph}`) }),
        view.graph_error ? ` (${view.graph_error})` : '')
      : null;
    openDialog(
      doc.title,
      graph,
      h('ol', { class: 'chunks' }, chunks.map((chunk) => h(
        'li',
        { id: `chunk-${chunk.chunk_id}`, class: chunk.chunk_id === current ? 'current' : null },
        h('p', { class: 'meta' }, [
          (chunk.heading_path || []).join(' › '),
          placeLabel(chunk.pages, chunk.heading_path),
          `${t('span')} ${chunk.span?.[0]}–${chunk.span?.[1]}`,
        ].filter(Boolean).join(' · ')),
        h('p', { class: 'text' }, chunk.text),
      ))),
    );
    if (current) document.getElementById(`chunk-${current}`)?.scrollIntoView({ block: 'nearest' });
  } catch (failed) {
    openDialog(doc.title, notice('error', failed.message));
  }
}
