// The console's shell: hash routing, sign-in, the language switch and the dialog. Each page
// is a module with `render(main, route)` that may return a function to call when leaving
// (to close its streams).
import { api, apiBase, key } from './api.js';
import { h, replace, field } from './dom.js';
import { t, language, setLanguage, translatePage } from './i18n.js';
import * as kbs from './kbs.js';
import * as documents from './documents.js';
import * as search from './search.js';
import * as chat from './chat.js';
import * as cluster from './cluster.js';
import * as graph from './graph.js';

const main = document.getElementById('main');
let leave = null;
let signingIn = false;

/** `#/kbs/docs?x=1` → {page: 'kbs', parts: ['docs'], query: URLSearchParams}. */
function parseRoute() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, queryText = ''] = raw.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || 'kbs', parts: parts.slice(1), query: new URLSearchParams(queryText) };
}

function pageFor(route) {
  if (route.page === 'kbs' && route.parts.length > 0) return documents;
  return { kbs, search, graph, chat, cluster }[route.page] || null;
}

function route() {
  if (leave) {
    try {
      leave();
    } catch (error) {
      console.warn('leaving the page failed', error);
    }
    leave = null;
  }
  if (signingIn) return showSignIn();
  const current = parseRoute();
  for (const link of document.querySelectorAll('#nav a')) {
    if (link.dataset.page === current.page) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  const page = pageFor(current);
  if (!page) {
    replace(main, h('h1', {}, t('notFound')));
    return;
  }
  replace(main);
  leave = page.render(main, current) || null;
}

function showSignIn(message) {
  signingIn = true;
  document.getElementById('sign-out').hidden = true;
  const input = h('input', {
    type: 'password',
    name: 'key',
    autocomplete: 'off',
    spellcheck: 'false',
    placeholder: 'sk-sift-…',
    required: true,
  });
  const keyField = field(t('signIn.key'), input, t('signIn.hint'));
  const error = keyField.querySelector('.field-error');
  if (message) error.textContent = message;
  const form = h(
    'form',
    { class: 'card narrow', 'aria-labelledby': 'sign-in-title' },
    h('h1', { id: 'sign-in-title' }, t('signIn.title')),
    keyField,
    h('button', { type: 'submit', class: 'primary' }, t('signIn.submit')),
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    key.set(input.value.trim());
    try {
      await api('GET', '/v1/kbs?limit=1');
      signingIn = false;
      document.getElementById('sign-out').hidden = false;
      route();
    } catch (failed) {
      key.clear();
      error.textContent = failed.status === 401 ? t('signIn.wrong') : failed.message;
      input.focus();
    }
  });
  replace(main, form);
  input.focus();
}

window.addEventListener('sift:unauthorized', () => {
  if (signingIn) return;
  key.clear();
  if (leave) {
    leave();
    leave = null;
  }
  showSignIn(t('signIn.expired'));
});

function setUpDialog() {
  const dialog = document.getElementById('dialog');
  document.getElementById('dialog-close').addEventListener('click', () => dialog.close());
  dialog.addEventListener('click', (event) => {
    if (event.target === dialog) dialog.close();
  });
}

async function authOff() {
  try {
    const answer = await fetch(`${apiBase()}/readyz`);
    return (await answer.json()).auth === 'off';
  } catch {
    return false;
  }
}

async function start() {
  setUpDialog();
  const switcher = document.getElementById('language');
  switcher.value = language();
  switcher.addEventListener('change', () => {
    setLanguage(switcher.value);
    translatePage();
    route();
  });
  translatePage();
  document.getElementById('sign-out').addEventListener('click', () => {
    key.clear();
    showSignIn();
  });
  window.addEventListener('hashchange', route);
  // An open node (auth off, said by /readyz) needs no key; otherwise sign in first, so that
  // no request goes out to be refused.
  if (!key.get() && !(await authOff())) {
    showSignIn();
    return;
  }
  try {
    await api('GET', '/v1/kbs?limit=1');
    document.getElementById('sign-out').hidden = !key.get();
    route();
  } catch (failed) {
    if (failed.status === 401) showSignIn();
    else {
      replace(main, h('p', { class: 'error', role: 'alert' }, t('unreachable'), ' ', failed.message));
    }
  }
}

start();
