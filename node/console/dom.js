// Small DOM helpers: elements from tag, attributes and children; no HTML strings, so no
// text from the API is ever parsed as markup.

/** `h('button', {class: 'x', onclick}, 'text', child)`. */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      element.addEventListener(name.slice(2), value);
    } else if (name === 'dataset') {
      Object.assign(element.dataset, value);
    } else if (value === true) {
      element.setAttribute(name, '');
    } else {
      element.setAttribute(name, String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces an element's children. */
export function replace(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

export function formatTime(ms) {
  if (!ms) return '';
  return new Date(ms).toLocaleString();
}

export function formatBytes(bytes) {
  if (bytes == null) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

/** A form field: label, control and a place for the API's error about it. */
export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  const error = h('p', { class: 'field-error', id: `${id}-error`, role: 'alert' });
  control.setAttribute('aria-describedby', `${id}-error`);
  return h(
    'div',
    { class: 'field' },
    h('label', { for: id }, label),
    control,
    hint ? h('p', { class: 'hint' }, hint) : null,
    error,
  );
}

/** Opens the page's one dialog with a title and content. */
export function openDialog(title, ...content) {
  const dialog = document.getElementById('dialog');
  document.getElementById('dialog-title').textContent = title;
  replace(document.getElementById('dialog-body'), ...content);
  if (!dialog.open) dialog.showModal();
}

/** A notice in words: `kind` is `error`, `warning` or `info`. */
export function notice(kind, ...content) {
  return h('p', { class: `notice ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, ...content);
}
