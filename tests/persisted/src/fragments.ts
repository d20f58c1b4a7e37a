import { graphql } from '../gen';

// The fields every view shows of a cell.
export const CellFields = graphql(`
  fragment CellFields on Cell {
    rowKey
    column
    refKey
    body
    createdAt
  }
`);
