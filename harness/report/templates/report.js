/* graph-harness: filters pytest-html's results table by mode, features and failed check, links
   the outcome grid to those filters, and fills each open row's details from its fragment.
   pytest-html replaces the whole table on every sort, filter and click, so the work is redone
   on each replacement (a MutationObserver), and only for rows that are shown and open. */
(function () {
  'use strict'
  const FIELDS = ['mode', 'features', 'check', 'text']

  const readHash = () => {
    const params = new URLSearchParams(window.location.hash.slice(1))
    const state = {}
    FIELDS.forEach((f) => { state[f] = params.get(f) || '' })
    return state
  }

  const writeHash = (state) => {
    const params = new URLSearchParams()
    FIELDS.forEach((f) => { if (state[f]) params.set(f, state[f]) })
    const hash = params.toString()
    history.replaceState(null, '', hash ? '#' + hash : window.location.pathname + window.location.search)
  }

  const cellText = (row, column) => {
    const cell = row.querySelector('td.col-' + column)
    return cell ? cell.textContent.trim() : ''
  }

  const matches = (row, state) => {
    if (state.mode && cellText(row, 'mode') !== state.mode) return false
    if (state.features && cellText(row, 'features') !== state.features) return false
    if (state.check) {
      const failed = cellText(row, 'check')
      if (state.check === '*' ? !failed : failed.split(' ')[0] !== state.check) return false
    }
    if (state.text && !(row.id || '').toLowerCase().includes(state.text.toLowerCase())) return false
    return true
  }

  // A row's fragment key sits on its Mode cell; the fragment goes into pytest-html's own
  // slot for extra HTML in the row's details, once.
  const fillRow = (extras) => {
    const target = extras.querySelector('.extraHTML')
    const key = extras.dataset.ghKey
    const source = key && document.getElementById('gh-x-' + key)
    if (!target || !source || extras.dataset.ghFilled) return
    extras.dataset.ghFilled = '1'
    target.insertAdjacentHTML('beforeend', source.textContent.replace(/<\\(\/script|!--)/gi, '<$1'))
  }

  // Open rows are filled as they come near the viewport: a redraw then lays out a screenful
  // of details, not those of every open row (pytest-html opens every failed and xfailed one).
  const nearView = 'IntersectionObserver' in window
    ? new IntersectionObserver((entries) => entries.forEach((entry) => {
      if (entry.isIntersecting) {
        nearView.unobserve(entry.target)
        fillRow(entry.target)
      }
    }), { rootMargin: '1500px 0px' })
    : null

  const fill = (row) => {
    const extras = row.querySelector('.extras-row')
    const cell = row.querySelector('td.col-mode[data-gh]')
    if (!extras || !cell || extras.classList.contains('hidden') || extras.dataset.ghFilled) return
    extras.dataset.ghKey = cell.dataset.gh
    if (nearView) nearView.observe(extras)
    else fillRow(extras)
  }

  const apply = () => {
    const state = readHash()
    if (nearView) nearView.disconnect()  // the rows it watched may have been replaced
    const rows = document.querySelectorAll('#results-table tbody.results-table-row')
    let shown = 0
    let total = 0
    rows.forEach((row) => {
      if (row.querySelector('#not-found-message')) return
      total += 1
      const show = matches(row, state)
      row.hidden = !show
      if (show) {
        shown += 1
        fill(row)
      }
    })
    const active = FIELDS.some((f) => state[f])
    const label = document.getElementById('gh-shown')
    if (label) label.textContent = active ? `showing ${shown} of ${total} rows` : `${total} rows`
    document.body.dataset.ghShown = String(shown)
    document.querySelectorAll('#gh-grid td.gh-cell').forEach((cell) => {
      cell.classList.toggle('gh-selected', !!state.mode && cell.dataset.mode === state.mode &&
        !!state.features && cell.dataset.features === state.features)
    })
    const form = document.getElementById('gh-filter')
    if (form) FIELDS.forEach((f) => { if (form.elements[f].value !== state[f]) form.elements[f].value = state[f] })
  }

  const setFilter = (changes) => {
    writeHash(Object.assign(readHash(), changes))
    apply()
  }

  const init = () => {
    const form = document.getElementById('gh-filter')
    if (form) {
      form.addEventListener('input', (evt) => setFilter({ [evt.target.name]: evt.target.value }))
      form.addEventListener('reset', () => setTimeout(() => setFilter({ mode: '', features: '', check: '', text: '' })))
    }
    document.querySelectorAll('#gh-grid td.gh-cell:not(.gh-empty)').forEach((cell) => {
      cell.addEventListener('click', () => {
        const state = readHash()
        const same = state.mode === cell.dataset.mode && state.features === cell.dataset.features
        setFilter(same ? { mode: '', features: '' } : { mode: cell.dataset.mode, features: cell.dataset.features })
        if (!same) document.getElementById('results-table')?.scrollIntoView({ behavior: 'smooth' })
      })
    })
    window.addEventListener('hashchange', apply)
    // pytest-html swaps in a new #results-table on every redraw: re-filter and re-fill then.
    new MutationObserver(apply).observe(document.body, { childList: true })
    apply()
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init)
  else init()
})()
